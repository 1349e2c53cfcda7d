"""Weight sync in place vs the DART way (export to disk, restart the engine), one run, both
under the same generation load.

    .venv/bin/python -m benchmarks.components.weight_sync [--size 0.5b|tiny] [--streams 4] [--updates 10]
                                  [--load auto|shadow|inplace] [--share-memory on|off]

A generated Qwen2.5-VL-shaped policy (about 0.5B parameters, fp32, 2.02 GB). The trainer
side runs in its own process, as in a deployment: the Flax policy and the weight publisher.
This process runs a vLLM engine (CPU build) with `--streams` requests generating
throughout, in the pause mode the configs use (`rollout.engine.pause`), and follows the
publisher as a rollout worker does, on the trainer's machine as in `configs/local.yaml`:
through shared memory (`--share-memory off`: over loopback TCP). Two versions warm up (the conversions compile, the
served window fills), then `--updates` measured ones, back to back (the worker subscribes
once; nothing waits a fixed time before a pause). Each update is split into:

- `wire_s`: from the engine's update call (the announcement heard) until every tensor is in
  the engine (shadow: also loaded beside generation, layer by layer);
- `pause_s`: the engine's pause, paused -> resumed (shadow: the swap; inplace: the load);
- `stall_s`: the longest stretch from the `publish` call until the first token after the
  resume in which no stream received a token (what the generating requests felt);
- `inplace_s`: from the publisher's `publish` call (perturbed weights: convert on the
  device into reused buffers, announce, fill) until this engine serves the new version.

Over the measured updates: `pause_p50_s`, `pause_p95_s`, `pause_max_s` (and the same for
stall, wire and inplace), each update's figures (`per_update`), and the last one's
`inplace_s` and `worker` stages;
- `disk_restart_s`: what DART's release does, under the same load: the trainer writes a
  Hugging Face checkpoint while the streams generate, then the engine shuts down and a new
  one starts on it, until its first token.

Per-stage seconds: the publisher's (lay out and announce, convert on the device, copy to
host memory, checksum), the worker's (announcement to pulled and loaded), and each stage
alone on the trainer side with nothing else running (`stages`: device conversion into
reused buffers, host copy, checksum, the pull with reassembly through shared memory and
over loopback TCP), in GB/s.

The last line printed is JSON with the figures and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

from benchmarks.common import machine, spread, work_dir

SIZES = {  # TinySpec overrides
    "0.5b": dict(text_hidden=1024, text_layers=24, text_heads=16, text_kv_heads=2, text_intermediate=4864,
                 vision_hidden=640, vision_heads=10, vision_depth=12, vision_intermediate=2560,
                 fullatt_block_indexes=(3, 7, 11)),
    "tiny": {},
}
WARMUP_VERSIONS = 2


def longest_gap(arrivals: list[float], start: float, end: float) -> float:
    """The longest stretch of [start, end] with no arrival in it."""
    edges = [start, *sorted(t for t in arrivals if start <= t <= end), end]
    return max(b - a for a, b in zip(edges, edges[1:]))


def trainer_process(hf_dir: str, share_memory: bool, conn) -> None:
    """The trainer side: the Flax policy and its publisher, driven by commands on `conn`."""
    import jax
    from flax import nnx

    from dart_jax.models import hf_io
    from dart_jax.train.publish import WeightPublisher
    from dart_jax.wire import WireConfig
    from dart_jax.wire.config import WeightSyncConfig

    model, _ = hf_io.load_model(hf_dir)
    params = nnx.state(model)
    conn.send(alone(params, model.config))
    loopback = WireConfig(endpoint="tcp://127.0.0.1:0", timeout_s=120)
    # one version served at a time: this machine's 24 GB hold the trainer, the engine and its
    # shadow copy of 2 GB each beside other work (the default window of 2 costs 2 GB more)
    publisher = WeightPublisher(WeightSyncConfig(announce=loopback, serve=loopback, keep_versions=1,
                                                 share_memory=share_memory), model.config)
    conn.send((publisher.pub.endpoint, publisher.server.endpoint))
    while (cmd := conn.recv()) != "stop":
        params = jax.block_until_ready(jax.tree.map(lambda x: x * 1.01, params))
        start = time.time()
        if cmd == "publish":
            version = publisher.publish(params)
            conn.send({"start": start, "version": version, **publisher.stages})
        elif cmd == "pull":  # the pull and the reassembly alone, through shared memory and over loopback
            conn.send({f"pull_and_reassemble_{way}": pull_alone(publisher, way == "shared")
                       for way in (["shared"] if publisher.regions is not None else []) + ["wire"]})
        else:  # ("export", out_dir)
            out = hf_io.export(params, model.config, cmd[1], src_dir=hf_dir)
            conn.send({"start": start, "export_s": time.time() - start, "dir": str(out)})
    publisher.close()


def alone(params, config) -> dict:
    """Each trainer-side stage alone (seconds and GB/s): the device conversion into the
    buffers of an earlier one, the host copy of its result, the checksum."""
    import jax
    import numpy as np

    from dart_jax.models.convert import to_hf_device
    from dart_jax.wire.weights import checksum

    reuse = None
    for _ in range(3):  # fresh, then into those buffers (compiles), then timed
        t = time.perf_counter()
        reuse = dict(to_hf_device(params, config, "float32", reuse=reuse))
        jax.block_until_ready(list(reuse.values()))
        convert_s = time.perf_counter() - t
    converted = list(reuse.values())
    t = time.perf_counter()
    hosted = [np.asarray(s.data).reshape(-1).view(np.uint8) for x in converted for s in x.addressable_shards]
    host_s = time.perf_counter() - t
    t = time.perf_counter()
    for h in hosted:
        checksum([h])
    checksum_s = time.perf_counter() - t
    nbytes = sum(h.nbytes for h in hosted)
    return {name: {"s": round(s, 3), "gb_per_s": round(nbytes / s / 1e9, 2)}
            for name, s in [("convert", convert_s), ("host_copy", host_s), ("checksum", checksum_s)]}


def pull_alone(publisher, shared: bool) -> dict:
    from dart_jax.wire import WireConfig
    from rollout_gpu.pull import Puller

    ann = next(reversed(publisher._versions.values())).announce
    buffers, regions = {}, {}  # kept across pulls, as the worker keeps them across versions
    for _ in range(2):  # the first maps the region and touches the buffers; the second is timed
        start = time.perf_counter()
        with Puller(ann, WireConfig(endpoint=ann.hosts[0], timeout_s=120), timeout_s=600, shared=shared,
                    buffers=buffers, regions=regions) as pulled:
            nbytes = sum(data.nbytes for _, data in pulled)
        s = time.perf_counter() - start
    return {"s": round(s, 3), "gb_per_s": round(nbytes / s / 1e9, 2)}


class Streams:
    """`n` requests generating back to back; the arrival time of every token."""

    def __init__(self, engine, prompt, n: int):
        self.engine, self.prompt, self.n = engine, prompt, n
        self.arrivals: list[float] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        await asyncio.gather(*(self._one(i) for i in range(self.n)))

    async def _one(self, i: int) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        params = SamplingParams(temperature=1.0, max_tokens=256, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        k = 0
        while not self.stop.is_set():
            k += 1
            request = {"prompt_token_ids": self.prompt.placeholder_ids.tolist()}
            async for out in self.engine.llm.generate(request, params, request_id=f"stream{i}-{k}"):
                self.arrivals.extend([time.time()] * len(out.outputs[0].token_ids))

    def stall(self, start: float, resumed: float) -> float:
        """The longest token gap from `start` to the first token after `resumed`."""
        after = min((t for t in self.arrivals if t > resumed), default=resumed)
        return longest_gap(self.arrivals, start, after)


async def update(engine, sub, weights, conn) -> dict:
    """Publish the next version in the trainer process and follow it as a worker does."""
    from rollout_gpu.worker import newest

    conn.send("publish")
    published = asyncio.create_task(asyncio.to_thread(conn.recv))
    ann = None
    while ann is None or ann.version <= engine.version:
        ann = await newest(sub, await sub.receive(timeout_s=1.0)) or ann
    heard = time.time()
    event = await engine.update(ann, weights)
    served = time.time()
    if not event.ok:
        raise RuntimeError(f"the update failed: {event.error}")
    return {"published": await published, "announce_heard": heard, "event": event, "served": served,
            "bytes": ann.total_bytes, "buckets": len(ann.buckets)}


def split(done: dict) -> dict[str, float]:
    """One update's seconds: wire, pause, publish -> served (the stall is the streams')."""
    event = done["event"]
    return {"wire_s": event.pulled - event.started, "pause_s": event.resumed - event.paused,
            "inplace_s": done["served"] - done["published"]["start"]}


async def measure(args, hf_dir: Path, conn) -> dict:
    from dart_jax.agent.prompt import PromptBuilder
    from dart_jax.wire import WireConfig
    from dart_jax.wire.config import WeightSyncConfig
    from dart_jax.wire.pubsub import Subscriber
    from rollout_gpu.config import EngineConfig, SamplingConfig
    from rollout_gpu.engine import Engine

    stages_alone = conn.recv()
    pub_endpoint, serve_endpoint = conn.recv()
    weights = WeightSyncConfig(announce=WireConfig(endpoint=pub_endpoint),
                               serve=WireConfig(endpoint=serve_endpoint, timeout_s=120))
    cfg = EngineConfig(max_model_len=2048, load=args.load, max_num_seqs=max(4, args.streams))
    engine = await Engine.start(hf_dir, cfg, SamplingConfig())
    prompt = PromptBuilder.from_pretrained(hf_dir).tokenize_messages(
        [{"role": "user", "content": "Type hello into the search box and press enter."}])
    streams = Streams(engine, prompt, args.streams)
    generating = asyncio.create_task(streams.run())
    sub = Subscriber(weights.announce)  # once: PUB drops what a subscriber missed while it connected
    await asyncio.sleep(args.warmup_s)
    first = None
    for _ in range(WARMUP_VERSIONS):
        done = await update(engine, sub, weights, conn)
        first = first or done["served"] - done["published"]["start"]
    updates = [await update(engine, sub, weights, conn) for _ in range(args.updates)]
    sub.close()
    await asyncio.sleep(1.0)  # tokens after the last resume close its stall measurement
    per_update = [split(d) | {"stall_s": streams.stall(d["published"]["start"], d["event"].resumed)} for d in updates]
    done = updates[-1]
    event, published = done["event"], done["published"]
    result = {
        "bytes": done["bytes"], "buckets": done["buckets"], "load": engine.load_mode, "pause_mode": cfg.pause,
        "updates": len(updates),
        **{f"{name.removesuffix('_s')}_{q}_s": v for name in ("pause_s", "stall_s", "wire_s", "inplace_s")
           for q, v in spread([u[name] for u in per_update]).items()},
        "per_update": [{k: round(v, 3) for k, v in u.items()} for u in per_update],
        "inplace_s": per_update[-1]["inplace_s"], "first_inplace_s": first,
        "publish_gb_per_s": published["bytes"] / published["publish_s"] / 1e9,
        "publish": {k: round(v, 3) for k, v in published.items() if k.endswith("_s")},
        "worker": {"announce_s": round(done["announce_heard"] - published["start"], 3),
                   "pull_s": round(event.pulled - event.started, 3),
                   "pull_and_load_s": round(event.paused - event.started, 3),
                   "swap_s": round(event.resumed - event.paused, 3)},
    }
    print("in place:", json.dumps(result), file=sys.stderr, flush=True)
    conn.send(("export", str(hf_dir.parent / "export")))  # under the same load: the streams go on
    exported = await asyncio.to_thread(conn.recv)
    restart = time.time()
    streams.stop.set()
    generating.cancel()  # the requests in flight die with the engine
    await asyncio.gather(generating, return_exceptions=True)
    engine.shutdown()
    engine = await Engine.start(exported["dir"], cfg, SamplingConfig(max_tokens=1))
    await engine.sample(prompt)
    result |= {"export_s": exported["export_s"], "restart_s": time.time() - restart}
    result["disk_restart_s"] = result["export_s"] + result["restart_s"]
    engine.shutdown()
    conn.send("pull")
    result["stages"] = stages_alone | await asyncio.to_thread(conn.recv)
    return result


def run(args: argparse.Namespace, work: Path) -> dict:
    """The trainer process beside this one, then the measurements."""
    from dart_jax.models.tiny import make_tiny_hf_dir
    hf_dir = make_tiny_hf_dir(work / "policy", **SIZES[args.size])
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    trainer = ctx.Process(target=trainer_process, args=(str(hf_dir), args.share_memory == "on", child), daemon=True)
    trainer.start()
    try:
        return asyncio.run(measure(args, hf_dir, conn))
    finally:
        conn.send("stop")
        trainer.join(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--load", choices=["auto", "shadow", "inplace"], default="auto")
    ap.add_argument("--share-memory", choices=["on", "off"], default="on",
                    help="the trainer serves this machine's worker through /dev/shm (configs/local.yaml: on)")
    ap.add_argument("--updates", type=int, default=10, help="measured updates after the warm-up versions")
    ap.add_argument("--warmup-s", type=float, default=10.0)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    with work_dir(args.work, "bench_weight_sync_") as work:
        result = run(args, work)
    result = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
    result["restart_over_inplace"] = round(result["disk_restart_s"] / result["inplace_s"], 1)
    print(json.dumps({"benchmark": "weight_sync", "size": args.size, "streams": args.streams,
                      "share_memory": args.share_memory == "on", **result,
                      "machine": machine()}))


if __name__ == "__main__":
    main()
