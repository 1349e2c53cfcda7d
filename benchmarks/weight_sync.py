"""Weight sync in place vs the DART way (export to disk, restart the engine), one run.

    .venv/bin/python -m benchmarks.weight_sync [--size 0.5b|tiny] [--streams 4] [--load shadow]

A generated Qwen2.5-VL-shaped policy (about 0.5B parameters, fp32). The trainer side runs
in its own process, as in a deployment: the Flax policy and the weight publisher. This
process runs a vLLM engine (CPU build) with `--streams` requests generating throughout,
and follows the publisher as a rollout worker does. Then:

- `inplace_s`: from the publisher's `publish` call (perturbed weights: convert, pack,
  announce) until this engine serves the new version (pulled beside generation, swapped in
  at a pause with in-flight requests frozen);
- `pause_s`: the longest stretch inside that window in which no stream received a token
  (the time the engine generated nothing);
- `disk_restart_s`: what DART's release does: the trainer writes a Hugging Face checkpoint
  to disk, the engine shuts down and a new one starts on it, until its first token.

The last line printed is JSON with `bytes`, `inplace_s`, `pause_s`, `disk_restart_s`, their
ratio and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine

SIZES = {  # TinySpec overrides
    "0.5b": dict(text_hidden=1024, text_layers=24, text_heads=16, text_kv_heads=2, text_intermediate=4864,
                 vision_hidden=640, vision_heads=10, vision_depth=12, vision_intermediate=2560,
                 fullatt_block_indexes=(3, 7, 11)),
    "tiny": {},
}


def trainer_process(hf_dir: str, conn) -> None:
    """The trainer side: the Flax policy and its publisher, driven by commands on `conn`."""
    import jax
    from dart_jax.models import hf_io
    from dart_jax.train.publish import WeightPublisher
    from dart_jax.wire import WireConfig
    from dart_jax.wire.weights import WeightSyncConfig
    from flax import nnx

    model, _ = hf_io.load_model(hf_dir)
    params = nnx.state(model)
    loopback = WireConfig(endpoint="tcp://127.0.0.1:0")
    publisher = WeightPublisher(WeightSyncConfig(announce=loopback, serve=loopback), model.config)
    conn.send((publisher.pub.endpoint, publisher.server.endpoint))
    while (cmd := conn.recv()) != "stop":
        params = jax.tree.map(lambda x: x * 1.01, params)
        start = time.time()
        if cmd == "publish":
            version = publisher.publish(params)
            conn.send({"start": start, "version": version, "publish_s": time.time() - start})
        else:  # ("export", out_dir)
            out = hf_io.export(params, model.config, cmd[1], src_dir=hf_dir)
            conn.send({"start": start, "export_s": time.time() - start, "dir": str(out)})
    publisher.close()


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

    def longest_gap(self, start: float, end: float) -> float:
        times = sorted(t for t in self.arrivals if start <= t <= end)
        edges = [start, *times, end]
        return max(b - a for a, b in zip(edges, edges[1:]))


async def follow_once(engine, announce, serve):
    from dart_jax.wire.messages import WeightAnnounce
    from dart_jax.wire.pubsub import Subscriber
    sub = Subscriber(announce)
    try:
        while not isinstance(ann := await sub.receive(timeout_s=1.0), WeightAnnounce) or ann.version <= engine.version:
            pass
    finally:
        sub.close()
    event = await engine.update(ann, serve)
    if not event.ok:
        raise RuntimeError(f"the update failed: {event.error}")
    return ann, event


async def measure(args, hf_dir: Path, conn) -> dict:
    from dart_jax.agent.prompt import PromptBuilder
    from dart_jax.wire import WireConfig
    from rollout_gpu.config import EngineConfig, SamplingConfig
    from rollout_gpu.engine import Engine

    pub_endpoint, serve_endpoint = conn.recv()
    cfg = EngineConfig(max_model_len=2048, pause="keep", load=args.load, max_num_seqs=max(4, args.streams))
    engine = await Engine.start(hf_dir, cfg, SamplingConfig())
    prompt = PromptBuilder.from_pretrained(hf_dir).tokenize_messages(
        [{"role": "user", "content": "Type hello into the search box and press enter."}])
    streams = Streams(engine, prompt, args.streams)
    generating = asyncio.create_task(streams.run())
    await asyncio.sleep(args.warmup_s)
    follower = asyncio.create_task(follow_once(engine, WireConfig(endpoint=pub_endpoint),
                                               WireConfig(endpoint=serve_endpoint, timeout_s=120)))
    conn.send("publish")
    published = await asyncio.to_thread(conn.recv)
    ann, event = await follower
    served = time.time()
    await asyncio.sleep(1.0)  # tokens after the resume close the gap measurement
    streams.stop.set()
    await generating
    result = {"bytes": ann.total_bytes, "buckets": len(ann.buckets), "publish_s": published["publish_s"],
              "inplace_s": served - published["start"], "pull_s": event.paused - event.started,
              "pause_s": streams.longest_gap(published["start"], served + 1.0),
              "swap_s": event.resumed - event.paused, "load": engine.load_mode}
    conn.send(("export", str(Path(args.work) / "export")))
    exported = await asyncio.to_thread(conn.recv)
    restart = time.time()
    engine.shutdown()
    engine = await Engine.start(exported["dir"], cfg, SamplingConfig(max_tokens=1))
    await engine.sample(prompt)
    result |= {"export_s": exported["export_s"], "restart_s": time.time() - restart}
    result["disk_restart_s"] = result["export_s"] + result["restart_s"]
    engine.shutdown()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--load", choices=["auto", "shadow", "inplace"], default="auto")
    ap.add_argument("--warmup-s", type=float, default=10.0)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    args.work = args.work or tempfile.mkdtemp(prefix="bench_weight_sync_")

    from dart_jax.models.tiny import make_tiny_hf_dir
    hf_dir = make_tiny_hf_dir(Path(args.work) / "policy", **SIZES[args.size])
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    trainer = ctx.Process(target=trainer_process, args=(str(hf_dir), child), daemon=True)
    trainer.start()
    try:
        result = asyncio.run(measure(args, hf_dir, conn))
    finally:
        conn.send("stop")
        trainer.join(60)
    result = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
    result["restart_over_inplace"] = round(result["disk_restart_s"] / result["inplace_s"], 1)
    print(json.dumps({"benchmark": "weight_sync", "size": args.size, "streams": args.streams, **result,
                      "machine": machine()}))


if __name__ == "__main__":
    main()
