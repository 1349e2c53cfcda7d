"""Weight updates on a real vLLM engine (CPU build) from a real weight publisher on the same
machine, through shared memory (tests/rollout_gpu/test_worker.py pulls over the wire): `inplace`
(vLLM's own reload_weights at the pause) and `shadow` both serve the new weights exactly
afterwards; in `keep` mode every response an update cuts across is marked and every other
one matches its version exactly; an incomplete version is refused; a pull past its timeout
fails and its threads end.

One engine for the module (start about 30 s). The tiny policy has init 0.1, so a weight
change moves the log-probs far beyond the parity bound.
"""

import asyncio
import dataclasses
import os
import threading
import time
from pathlib import Path

import jax
import msgspec
import numpy as np
import pytest
from flax import nnx

from dart_jax.agent.prompt import PromptBuilder
from dart_jax.models import hf_io, qwen25vl
from dart_jax.models.inputs import make_inputs
from dart_jax.models.tiny import make_tiny_hf_dir
from dart_jax.train.publish import WeightPublisher
from dart_jax.wire import WireConfig
from dart_jax.wire.config import WeightSyncConfig
from dart_jax.wire.messages import WeightPull
from rollout_gpu.config import EngineConfig, SamplingConfig
from rollout_gpu.engine import Engine

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PARITY_MEAN = 1e-5  # vLLM vs the trainer, fp32 (as tests/rollout_gpu/test_worker.py)
PARITY_MAX = 1e-4
WIDTH = 512  # scoring pads every sequence to this: one compilation
TASKS = ["Type hello into the search box.", "Click the OK button.", "Scroll down to the footer.",
         "Select the second option.", "Close the dialog.", "Open the settings menu."]


@dataclasses.dataclass
class System:
    loop: asyncio.AbstractEventLoop
    engine: Engine
    publisher: WeightPublisher
    weights: WeightSyncConfig
    graphdef: object
    params: object
    versions: dict  # version -> params
    prompts: list

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def publish(self, params):
        version = self.publisher.publish(params)
        self.versions[version] = params
        return self.publisher._versions[version].announce


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    hf_dir = make_tiny_hf_dir(tmp_path_factory.mktemp("inplace") / "policy", init_std=0.1)
    model, _ = hf_io.load_model(hf_dir)
    graphdef, params = nnx.split(model)
    loopback = WireConfig(endpoint="tcp://127.0.0.1:0", timeout_s=10)
    publisher = WeightPublisher(WeightSyncConfig(announce=loopback, serve=loopback, bucket_mb=1, share_memory=True),
                                model.config)
    weights = WeightSyncConfig(announce=WireConfig(endpoint=publisher.pub.endpoint),
                               serve=WireConfig(endpoint=publisher.server.endpoint, timeout_s=10), pull_timeout_s=60)
    builder = PromptBuilder.from_pretrained(hf_dir)
    prompts = [builder.tokenize_messages([{"role": "user", "content": t}]) for t in TASKS]
    loop = asyncio.new_event_loop()
    engine = loop.run_until_complete(Engine.start(hf_dir, EngineConfig(max_model_len=1024, max_num_seqs=8, pause="keep"),
                                                  SamplingConfig(max_tokens=24)))
    try:
        yield System(loop, engine, publisher, weights, graphdef, params, {0: params}, prompts)
    finally:
        sockets = engine._sockets
        engine.shutdown()
        publisher.close()
        loop.close()
    assert not sockets.exists(), f"the engine left its ipc sockets: {sorted(os.listdir(sockets))}"


def test_the_engine_keeps_its_ipc_sockets_in_a_folder_of_its_own(system):
    """vLLM's sockets and the weight pulls' go to the engine's folder (removed at shutdown: the
    fixture checks), inside the session's VLLM_RPC_BASE_PATH, which is as it was."""
    base = os.environ["VLLM_RPC_BASE_PATH"]
    sockets = system.engine._sockets
    assert sockets.parent == Path(base) and any(sockets.iterdir())


def perturbed(params, seed: int):
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(params))))
    return jax.tree.map(lambda x: x * (1 + 0.1 * jax.random.normal(next(keys), x.shape, x.dtype)), params)


_SCORE = {}


def policy_logprobs(system: System, params, prompt, response_ids) -> np.ndarray:
    """log p(response) under the Flax policy with `params`, at temperature 1 (the rollout's)."""
    if "fn" not in _SCORE:
        graphdef = system.graphdef
        _SCORE["fn"] = jax.jit(lambda p, inputs: qwen25vl.logits((graphdef, p), inputs))
    ids = np.concatenate([prompt.token_ids, response_ids])
    ids_BxT, mask_BxT = np.zeros((1, WIDTH), np.int64), np.zeros((1, WIDTH), np.int64)
    ids_BxT[0, :len(ids)], mask_BxT[0, :len(ids)] = ids, 1
    logits = np.asarray(_SCORE["fn"](params, make_inputs(system.publisher.model_config, ids_BxT, mask_BxT)), np.float64)
    x = logits[0, len(prompt.token_ids) - 1:len(ids) - 1]
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    return x[np.arange(len(response_ids)), response_ids] - lse


def scorable(system, sample) -> int:
    """The response's tokens up to its first vision token (the random tiny policy samples them;
    a text-only forward cannot score them, and the trainer never trains such a step)."""
    c = system.publisher.model_config
    vision = [c.image_token_id, c.video_token_id, c.vision_start_token_id, c.vision_end_token_id]
    hits = np.flatnonzero(np.isin(sample.token_ids, vision))
    return int(hits[0]) if len(hits) else len(sample.token_ids)


def draw(system, prompt, need: int = 4, tries: int = 8):
    """A response with at least `need` scorable tokens: the random policy ends some after one
    token or opens an image at once, a sampled length no sampling setting may change here
    (min_tokens would change the distribution vLLM reports), so draw again."""
    for _ in range(tries):
        sample = system.run(system.engine.sample(prompt))
        if scorable(system, sample) >= need:
            return sample
    raise AssertionError(f"{tries} responses in a row had fewer than {need} scorable tokens: {sample.token_ids}")


def gap(system, params, prompt, sample) -> tuple[float, float]:
    """Over the response up to its first vision token (see `scorable`)."""
    n = scorable(system, sample)
    assert n >= 4, sample.token_ids
    d = np.abs(policy_logprobs(system, params, prompt, sample.token_ids[:n]) - sample.logprobs[:n])
    return float(d.mean()), float(d.max())


@pytest.mark.parametrize("load", ["inplace", "shadow"])
def test_an_update_serves_the_new_weights_exactly(system, load):
    old = system.versions[system.engine.version]
    new = perturbed(old, len(system.versions))
    system.engine.load_mode = load
    ann = system.publish(new)
    sent, shared = system.publisher.bytes_served, system.publisher.bytes_shared
    event = system.run(system.engine.update(ann, system.weights))
    assert event.ok, event.error
    assert system.engine.version == ann.version
    assert (system.publisher.bytes_served, system.publisher.bytes_shared) == (sent, shared + ann.total_bytes)
    for prompt in system.prompts[:3]:
        sample = draw(system, prompt)
        assert sample.policy_version == ann.version and not sample.straddles_update
        mean, worst = gap(system, new, prompt, sample)
        assert mean <= PARITY_MEAN and worst <= PARITY_MAX, (load, mean, worst)
        assert gap(system, old, prompt, sample)[0] > 100 * PARITY_MEAN  # no longer the old weights


def test_in_keep_mode_responses_cut_by_an_update_are_marked_and_the_rest_are_exact(system):
    engine = system.engine
    engine.load_mode = "inplace"
    old_version = engine.version
    new = perturbed(system.versions[old_version], 100)
    ann = system.publish(new)
    long = dataclasses.replace(engine.sampling, max_tokens=400)

    async def scenario():
        engine.sampling = long
        try:
            in_flight = [asyncio.create_task(engine.sample(p)) for p in system.prompts]
            await asyncio.sleep(0.5)
            event = await engine.update(ann, system.weights)
            return event, await asyncio.gather(*in_flight)
        finally:
            engine.sampling = dataclasses.replace(long, max_tokens=24)

    event, cut = system.run(scenario())
    assert event.ok, event.error
    straddling = [s for s in cut if s.straddles_update]
    assert straddling, "the update landed after every response had finished"
    assert all(s.policy_version == old_version for s in cut)  # labelled with the version they were submitted under
    for prompt, sample in zip(system.prompts, cut):
        # finished before the pause: exactly the old weights (judged where long enough to score)
        if not sample.straddles_update and scorable(system, sample) >= 4:
            mean, worst = gap(system, system.versions[old_version], prompt, sample)
            assert mean <= PARITY_MEAN and worst <= PARITY_MAX
    for prompt in system.prompts[:2]:
        sample = draw(system, prompt)
        assert sample.policy_version == ann.version and not sample.straddles_update
        mean, worst = gap(system, new, prompt, sample)
        assert mean <= PARITY_MEAN and worst <= PARITY_MAX


def test_a_version_missing_a_tensor_is_refused_and_the_engine_serves_on(system):
    engine = system.engine
    version = engine.version
    ann = system.publish(perturbed(system.versions[version], 200))
    renamed = msgspec.structs.replace(ann, tensors=[msgspec.structs.replace(ann.tensors[0], name="model.extra.weight"),
                                                    *ann.tensors[1:]])
    event = system.run(engine.update(renamed, system.weights))
    assert not event.ok and f"missing {ann.tensors[0].name}" in event.error
    sample = draw(system, system.prompts[0])
    assert engine.version == sample.policy_version == version
    assert gap(system, system.versions[version], system.prompts[0], sample)[0] <= PARITY_MEAN


def test_a_pull_past_its_timeout_fails_and_its_threads_end(system):
    engine = system.engine
    version = engine.version
    ann = system.publish(perturbed(system.versions[version], 300))
    serve, stall = system.publisher.server.handler, threading.Event()

    def stalls(msg):
        if isinstance(msg, WeightPull) and msg.bucket >= 1:
            stall.wait(30)
        return serve(msg)
    system.publisher.server.handler = stalls
    try:
        start = time.monotonic()
        event = system.run(engine.update(ann, dataclasses.replace(system.weights, pull_timeout_s=3)))
        took = time.monotonic() - start
        (status,) = system.run(engine.llm.collective_rpc("dart_update_status"))
    finally:
        stall.set()
        system.publisher.server.handler = serve
    assert not event.ok and "pull timeout" in event.error and took < 10, (event.error, took)
    assert status["state"] == "idle" and status["threads"] == 0
    assert engine.version == version
