"""Record a small run for tests/run: the real data manager, emulated roles, real wall clock.

    PYTHONPATH=$PWD python tests/observe/data/emulate.py tests/observe/data/run    # about 40 s

The data manager (`DataManager.handle`: scheduling, ingest, curation, batch records) runs in
this process and owns the store, as in a run. Around it, asyncio tasks play the other roles
on the wall clock with the timings of the local stack: 2 rollout workers with 3 episodes
each, on 8 env slots of one env server; a model call takes 0.4-0.7 s, slows with the
requests in flight and waits out weight-load pauses; an env step takes 45-75 ms (MiniWoB++),
a reset 80 ms; the trainer waits for each curated batch, updates for about a second,
publishes, and every worker then pulls the new weights beside generation and pauses
generation to load them. Each role writes what the
real one writes, with the real writers: wire `Trajectory`/`Step` records through the data
manager, `metrics/trainer.jsonl` lines with the RL loop's keys, `metrics/rollout-<id>.jsonl`
sync and trajectory lines, and `eval/v<N>.json` every 2 versions from `dart-jax eval`'s
report. Success is drawn from a per-task rate that rises with the policy version (the
emulation trains nothing). Token arrays hold one id each and there are no screenshots, so the
store stays small; it is vacuumed into rollback-journal mode so git holds one file.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
from pathlib import Path

import numpy as np

from dart_jax.data.config import CurationConfig, DataManagerConfig, TaskEntry, TaskSourceConfig
from dart_jax.data.service import DataManager
from dart_jax.eval.stats import Outcome, report
from dart_jax.rundir import MetricsWriter, RunDir
from dart_jax.wire.messages import (BatchRequest, CuratedBatch, NoTask, Step, SubmitTrajectory, TaskAssignment,
                                    TaskRequest, Trajectory, WorkerHeartbeat)

DURATION_S = 36.0
SLOTS = [f"tcp://127.0.0.1:5560#{i}" for i in range(8)]
WORKERS, EPISODES = ("w0", "w1"), 3
TRAIN = {f"synthetic/click-button/{i}": 0.25 + 0.1 * i for i in range(4)}  # task -> success at version 0
EVAL = ("synthetic/click-button/100", "synthetic/click-button/101")
CURATION = CurationConfig(tasks_per_batch=2, group_size=4, max_rollouts=4, max_staleness=2, min_steps=2,
                          default_max_steps=3, max_steps=3, max_pending_per_task=6)
rng = np.random.default_rng(7)


def success_rate(task_id: str, version: int) -> float:
    return min(0.95, TRAIN.get(task_id, 0.2) + 0.05 * max(version, 0))


async def timed(seconds: float) -> tuple[float, float]:
    start = time.time()
    await asyncio.sleep(seconds)
    return start, time.time()


class Engine:
    """A worker's engine: a request generates for its duration plus any weight-load pause
    that froze it meanwhile (few wakeups, so a loaded machine stretches it little)."""

    def __init__(self, worker_id: str, log: MetricsWriter):
        self.worker_id, self.log = worker_id, log
        self.version, self.active, self.started, self.done = 0, 0, 0, 0
        self.running = asyncio.Event()
        self.running.set()
        self.paused_s = 0.0  # total time generation was paused so far
        self.loads: list[tuple[int, float, float]] = []

    async def generate(self) -> tuple[tuple[float, float], int, bool]:
        start, version, paused_before = time.time(), self.version, self.paused_s
        self.active += 1
        await asyncio.sleep(rng.uniform(0.4, 0.7) * (1 + 0.2 * self.active))
        await self.running.wait()
        if self.paused_s > paused_before:  # frozen by a load: the lost time is made up
            await asyncio.sleep(self.paused_s - paused_before)
        self.active -= 1
        return (start, time.time()), version, self.version != version

    async def load(self, version: int) -> None:
        started = time.time()
        await asyncio.sleep(rng.uniform(0.4, 0.8))  # the pull, beside generation
        paused = time.time()
        self.running.clear()
        await asyncio.sleep(rng.uniform(0.15, 0.3))
        self.version, resumed = version, time.time()
        self.running.set()
        self.paused_s += resumed - paused
        self.loads.append((version, paused, resumed))
        self.log.write(self.done, {"sync_version": version, "sync_ok": True, "sync_started": started,
                                   "sync_paused": paused, "sync_resumed": resumed, "sync_error": ""})


def step(gen_s, env_s, version: int, straddles: bool) -> Step:
    return Step(prompt_ids=np.array([7], np.int32), response_ids=np.array([5], np.int32),
                logprobs=np.array([-0.5], np.float32), image_refs=[], policy_version=version,
                response_text="Action: wait()", action="wait()", straddles_update=straddles, gen_s=gen_s, env_s=env_s)


async def episode(dm: DataManager, engine: Engine, slots: asyncio.Queue, assignment: TaskAssignment) -> None:
    task = assignment.task
    engine.started += 1
    slot = await slots.get()
    first_load = len(engine.loads)
    reset_s = await timed(0.08)
    wins = rng.random() < success_rate(task.task_id, engine.version)
    length = int(rng.integers(1, assignment.max_steps + 1)) if wins else assignment.max_steps
    steps = []
    for _ in range(length):
        gen_s, version, straddles = await engine.generate()
        steps.append(step(gen_s, await timed(rng.uniform(0.045, 0.075)), version, straddles))
    evaluate_s = await timed(0.03)
    slots.put_nowait(slot)
    status = "success" if wins else ("truncated" if rng.random() < 0.5 else "failure")
    traj = Trajectory(traj_id=f"{engine.worker_id}-{engine.started}", task_id=task.task_id, steps=steps,
                      screenshots=[], reward=float(wins), status=status, worker_id=engine.worker_id,
                      created_at=time.time(), assignment_id=assignment.assignment_id, env_slot=slot,
                      reset_s=reset_s, evaluate_s=evaluate_s, weight_loads=engine.loads[first_load:])
    await asyncio.to_thread(dm.handle, SubmitTrajectory(trajectory=traj))
    engine.done += 1
    engine.log.write(engine.done, {"traj": traj.traj_id, "task": traj.task_id, "status": status,
                                   "reward": traj.reward, "steps": len(steps), "version": engine.version})


async def worker(dm: DataManager, engine: Engine, slots: asyncio.Queue, end: float) -> None:
    """K episode loops sharing the worker's assignments; a heartbeat beside them."""
    queue: list[TaskAssignment] = []
    lock = asyncio.Lock()

    async def next_rollout() -> TaskAssignment:
        async with lock:
            while not queue:
                reply = await asyncio.to_thread(dm.handle, TaskRequest(
                    worker_id=engine.worker_id, policy_version=engine.version, session=engine.worker_id))
                if isinstance(reply, NoTask):
                    await asyncio.sleep(0.5)
                else:
                    queue.extend([reply] * reply.num_rollouts)
            return queue.pop()

    async def loop() -> None:
        while time.time() < end:
            await episode(dm, engine, slots, await next_rollout())

    async def heartbeat() -> None:
        while time.time() < end:
            await asyncio.sleep(5)
            await asyncio.to_thread(dm.handle, WorkerHeartbeat(
                worker_id=engine.worker_id, session=engine.worker_id, policy_version=engine.version))

    await asyncio.gather(heartbeat(), *(loop() for _ in range(EPISODES)))


async def trainer(dm: DataManager, engines: list[Engine], run: RunDir, end: float) -> None:
    log = MetricsWriter(run.metrics_path("trainer"))
    version = batch_id = 0
    loads = []
    while time.time() < end - 3:
        fetched = time.time()
        batch = await fetch(dm, BatchRequest(trainer_version=version, after_batch_id=batch_id), end)
        if batch is None:
            break
        started = time.time()
        versions = [s.policy_version for t in batch.trajectories if t.source == "rollout" for s in t.steps]
        await asyncio.sleep(0.6 + 0.02 * len(versions))
        published = time.time()
        await asyncio.sleep(0.3)
        version, batch_id = version + 1, batch.batch_id
        log.write(version, {"policy/version": version, "batch/id": batch_id,
                            "batch/trajectories": len(batch.trajectories), "batch/injected": len(batch.injected),
                            "time/fetch_start": fetched, "time/update_start": started,
                            "time/publish_start": published, "time/publish_end": time.time(),
                            "staleness/max": float(version - 1 - min(versions)),
                            "staleness/mean": float(version - 1 - sum(versions) / len(versions))})
        loads += [asyncio.create_task(engine.load(version)) for engine in engines]
        if version % 2 == 0:
            write_eval(run, version)
    await asyncio.gather(*loads)
    log.close()


async def fetch(dm: DataManager, request: BatchRequest, end: float) -> CuratedBatch | None:
    while time.time() < end:
        reply = await asyncio.to_thread(dm.handle, request)
        if isinstance(reply, CuratedBatch):
            return reply
        await asyncio.sleep(0.5)
    return None


def write_eval(run: RunDir, version: int) -> None:
    """`dart-jax eval`'s report at `version`: 4 sampled and 1 greedy episode per held-out task."""
    outcomes = []
    for task in EVAL:
        for mode, sample in [("sampled", i) for i in range(4)] + [("greedy", 0)]:
            wins = bool(rng.random() < success_rate(task, version) - 0.1)
            outcomes.append(Outcome(task, mode, sample, wins, float(wins), 3, "success" if wins else "failure"))
    (run.root / "eval").mkdir(exist_ok=True)
    result = report(f"v{version}", run.root / "export" / f"v{version}", outcomes)
    (run.root / "eval" / f"v{version}.json").write_text(json.dumps(result, indent=1))


async def main(out: Path) -> None:
    run = RunDir.create(out)
    tasks = tuple(TaskEntry(t, "synthetic", "click-button", seed=int(t.rsplit("/", 1)[1])) for t in TRAIN) + tuple(
        TaskEntry(t, "synthetic", "click-button", seed=int(t.rsplit("/", 1)[1]), split="eval") for t in EVAL)
    dm = DataManager(DataManagerConfig(curation=CURATION, tasks=TaskSourceConfig(tasks=tasks)), run.root)
    slots: asyncio.Queue = asyncio.Queue()
    for slot in SLOTS:
        slots.put_nowait(slot)
    engines = [Engine(w, MetricsWriter(run.metrics_path(f"rollout-{w}"))) for w in WORKERS]
    end = time.time() + DURATION_S
    await asyncio.gather(trainer(dm, engines, run, end), *(worker(dm, e, slots, end) for e in engines))
    for engine in engines:
        engine.log.close()
    dm.close()
    with sqlite3.connect(run.data / "store.sqlite") as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("VACUUM")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
