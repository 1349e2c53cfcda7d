"""An OSWorld-sized curated batch (64 trajectories x 30 steps of 1920x1080 PNGs) flows from a data
manager serving over ZeroMQ into a train step: screenshots travel by hash, never inline."""

import io
import threading
import zlib

import numpy as np
import pytest
from PIL import Image

from dart_jax.config import from_dict
from dart_jax.data import service
from dart_jax.data.config import DataManagerConfig
from dart_jax.data.store import Store
from dart_jax.data.tasks import write_task_file
from dart_jax.testing.trajectories import put, task_specs
from dart_jax.models.sharding import make_mesh
from dart_jax.train.collate import Collator
from dart_jax.train.config import LossConfig, SelectionConfig, TrainerConfig
from dart_jax.train.sources import DataManagerSource, layout_rl_batch
from dart_jax.train.screens import FetchedScreens
from dart_jax.train.trainer import Trainer
from dart_jax.wire import Client, codec
from dart_jax.wire.messages import BatchRequest, CuratedBatch, Step, Trajectory
from tests.train_batches import collator

TASKS, GROUP, STEPS, SHOWN = 8, 8, 30, 5  # DART's prompt keeps the last 5 screenshots


def _desktop_pngs(n: int) -> list[bytes]:
    """n distinct 1920x1080 PNGs of about 1 MB (desktop screenshots compress to 0.3-2 MB): a
    flat colour, and a band of noise that does not compress."""
    rng = np.random.default_rng(0)
    out = []
    for k in range(n):
        image_HxWx3 = np.full((1080, 1920, 3), (40 * k, 90, 160), np.uint8)
        image_HxWx3[200:380] = rng.integers(0, 256, (180, 1920, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(image_HxWx3).save(buf, "PNG")
        out.append(buf.getvalue())
    return out


def _desktop_trajectory(col: Collator, k: int, pngs: list[bytes]) -> Trajectory:
    """Trajectory k of task k % TASKS (the first of each task succeeds): 30 steps over 1920x1080
    screens, step t's prompt showing screenshots t-4..t, each an expanded run of image pads as
    the policy saw it (text token ids made up, below the vision ids)."""
    c, pads = col.config, col.image_cfg.num_image_tokens(1080, 1920)
    image = np.asarray([c.vision_start_token_id] + [c.image_token_id] * pads + [c.vision_end_token_id], np.int32)
    rng = np.random.default_rng(zlib.crc32(str(k).encode()))
    text = lambda n: rng.integers(10, c.vision_start_token_id, n).astype(np.int32)  # noqa: E731
    steps = []
    for t in range(STEPS):
        shown = list(range(max(0, t - SHOWN + 1), t + 1))
        prompt = np.concatenate([text(40)] + [np.concatenate([image, text(12)]) for _ in shown])
        steps.append(Step(prompt_ids=prompt, response_ids=text(24), logprobs=-rng.random(24, dtype=np.float32),
                          image_refs=shown, policy_version=0, response_text="x"))
    success = k < TASKS
    return Trajectory(traj_id=f"t{k % TASKS}-{k}", task_id=f"t{k % TASKS}", steps=steps, reward=float(success),
                      screenshots=[pngs[(j + k) % len(pngs)] for j in range(STEPS + 1)],
                      status="success" if success else "failure")


@pytest.fixture
def osworld_manager(tmp_path, tiny_dir):
    """A data manager over ZeroMQ whose store holds 64 OSWorld-sized trajectories (6 PNG
    contents reused across steps and trajectories keep the test fast: the store keeps one copy
    of each, where inline trajectories carried every copy)."""
    pngs = _desktop_pngs(6)
    trajs = [_desktop_trajectory(collator(tiny_dir, 1), k, pngs) for k in range(TASKS * GROUP)]
    store = Store(tmp_path / "data" / "store.sqlite", tmp_path / "data" / "blobs")
    store.upsert_tasks(task_specs(n_train=TASKS))
    put(store, *trajs)
    store.close()
    write_task_file(tmp_path / "tasks.jsonl", task_specs(n_train=TASKS))
    cfg = from_dict(DataManagerConfig, {
        "wire": {"endpoint": f"ipc://{tmp_path}/dm.sock", "timeout_s": 60},  # the default 256 MiB limit
        "tasks": {"task_file": "tasks.jsonl"},
        "curation": {"tasks_per_batch": TASKS, "group_size": GROUP}})
    stop = threading.Event()
    thread = threading.Thread(target=service.serve, args=(cfg, tmp_path, stop))
    thread.start()
    yield cfg, trajs
    stop.set()
    thread.join()


def _first_screens(traj: Trajectory, step: Step) -> bool:
    """The first steps of t0's trajectories 0, 8, 16 and 24 (which start on PNGs 0, 2, 4, 0)."""
    return traj.traj_id in ("t0-0", "t0-8", "t0-16", "t0-24") and len(step.image_refs) == 1


def test_an_osworld_sized_batch_flows_from_the_data_manager_into_a_train_step(osworld_manager, tiny_dir):
    """The curated batch names its screenshots by hash and stays under the message limit (the
    PNGs inline would exceed it 4 times over); the trainer lays out all 1920 steps from screenshot
    sizes alone, fetches by hash over the wire the screenshots of the steps it trains, decodes
    each once however many steps show it, and runs one RL update."""
    cfg, trajs = osworld_manager
    limit = cfg.wire.max_message_bytes
    with Client(cfg.wire) as client:
        batch = client.request(BatchRequest(trainer_version=0, after_batch_id=0))
    assert isinstance(batch, CuratedBatch) and len(batch.trajectories) == TASKS * GROUP
    assert {len(t.steps) for t in batch.trajectories} == {STEPS} and all(not t.screenshots for t in batch.trajectories)
    message = sum(len(memoryview(f)) for f in codec.encode(batch))
    inline_png = sum(len(png) for t in trajs for png in t.screenshots)
    assert message < limit / 2 and inline_png > 4 * limit

    def no_fetch(shas):
        raise AssertionError("the layout fetched screenshots")

    every = collator(tiny_dir, 8, seq_lens=(4096, 16384), num_slots=(11520, 57600))  # holds every step
    assert len(layout_rl_batch(batch, every, FetchedScreens(batch.screens, no_fetch), shard=(0, 1)).reward_N) == 1920

    # the trainer keeps 4 single-screenshot steps (what a 2-core CPU trains in a test's time),
    # each at full size: 11,520 vision slots of 1920x1080 pixels
    col = collator(tiny_dir, 4, seq_lens=(4096,), num_slots=(11520,))
    source = DataManagerSource(cfg.wire, col, keep=_first_screens, shard=(0, 1), max_wait_s=30)
    asked, fetch = [], source.fetch_screenshots
    source.fetch_screenshots = lambda shas: asked.append(list(shas)) or fetch(shas)
    rl = next(source)  # batch 1 again: the data manager replays it
    assert (rl.batch_id, len(rl.reward_N), asked) == (1, 4, [])
    trainer = Trainer(TrainerConfig(mode="rl", loss=LossConfig(kl_coef=0.0), selection=SelectionConfig(enabled=False)),
                      tiny_dir, make_mesh(1, 1, 1))
    metrics = trainer.update_rl(rl, col)
    source.close()

    shown = {rl.screens.refs(r.traj)[0].sha256 for rows in rl.layout for row in rows for r in row}
    assert len(shown) == 3  # one shown twice: fetched and decoded once
    assert sorted(sha for a in asked for sha in a) == sorted(shown)
    assert int(metrics["batch/steps"]) == 4 and int(metrics["batch/screens_decoded"]) == 3
    assert trainer.step == 1 and np.isfinite(float(metrics["loss/total"])) and float(metrics["optim/grad_norm"]) > 0
