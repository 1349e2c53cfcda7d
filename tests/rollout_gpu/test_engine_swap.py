"""The engine's weight swap against a scripted vLLM: no request enters while the swap holds
the engine paused, a response is labelled with the version it was submitted under and
marked straddling unless all of it came from that version (a request frozen mid-prefill
across an update has only new tokens), a version missing a tensor is refused before a byte
is pulled, and a load that fails at the pause leaves the engine paused under no version."""

import asyncio
import types

import numpy as np
import pytest

from dart_jax.agent.prompt import Prompt
from dart_jax.wire.config import WeightSyncConfig
from dart_jax.wire.messages import TensorInfo, WeightAnnounce
from rollout_gpu.config import EngineConfig, SamplingConfig
from rollout_gpu.engine import Engine, EngineBroken

EXPECTED = {"model.embed_tokens.weight": [8, 4], "model.norm.weight": [4]}


def announce(version: int, tensors=EXPECTED) -> WeightAnnounce:
    return WeightAnnounce(version=version, hosts=["tcp://127.0.0.1:1"], buckets=[], total_bytes=0, published_at=0.0,
                          tensors=[TensorInfo(name=n, dtype="float32", shape=s) for n, s in tensors.items()])


class ScriptedLLM:
    """AsyncLLM's surface the engine uses. `pause_generation` holds until `release` is set;
    each request's tokens carry the label current when they are produced, and a request
    marked `frozen` (mid-prefill when the pause came) produces its tokens after the resume."""

    def __init__(self, commit_error: Exception | None = None):
        self.release = asyncio.Event()
        self.paused = asyncio.Event()
        self.resumed = asyncio.Event()
        self.label = "0"
        self.pauses: list[dict] = []
        self.rpcs: list[str] = []
        self.commit_error = commit_error
        self.requests: list[tuple[dict, bool]] = []  # (request, engine paused when it came)
        self.freeze_next = False

    async def pause_generation(self, *, mode, clear_cache):
        self.pauses.append({"mode": mode, "clear_cache": clear_cache})
        self.paused.set()
        await self.release.wait()

    async def resume_generation(self):
        self.paused.clear()
        self.resumed.set()

    async def collective_rpc(self, method, args=()):
        self.rpcs.append(method)
        if method == "dart_commit_update" and self.commit_error is not None:
            raise self.commit_error
        return []

    async def reset_encoder_cache(self):
        pass

    async def update_weight_version(self, version):
        self.label = version

    async def generate(self, request, params, request_id):
        self.requests.append((request, self.paused.is_set()))
        if self.freeze_next:  # its prefill started before the pause; every token comes after the resume
            self.freeze_next = False
            await self.resumed.wait()
        span = types.SimpleNamespace(version=self.label, start=0, end=2)
        completion = types.SimpleNamespace(token_ids=[7, 8], text="xy", weight_versions=[span],
                                           logprobs=[{7: types.SimpleNamespace(logprob=-0.5)},
                                                     {8: types.SimpleNamespace(logprob=-0.25)}])
        yield types.SimpleNamespace(prompt_token_ids=request["prompt_token_ids"], outputs=[completion])


def _prompt() -> Prompt:
    ids = np.asarray([1, 2, 3], np.int32)
    return Prompt(token_ids=ids, placeholder_ids=ids, images=(), image_grid_thw=np.zeros((0, 3), np.int64))


def _engine(llm, pause="keep") -> Engine:
    engine = Engine(llm, EngineConfig(pause=pause), SamplingConfig(), version=0, expected=EXPECTED)

    async def pulled(ann, weights):
        llm.rpcs.append("pull")
        return "", 0.0
    engine._pull = pulled
    return engine


def test_a_sample_asked_for_during_a_swap_waits_for_the_new_version_and_the_wait_pause_clears_the_cache():
    async def scenario():
        llm = ScriptedLLM()
        engine = _engine(llm, pause="wait")
        swap = asyncio.create_task(engine.update(announce(1), WeightSyncConfig()))
        await llm.paused.wait()
        sample = asyncio.create_task(engine.sample(_prompt()))
        await asyncio.sleep(0.05)
        assert not llm.requests  # held back while the engine is paused
        llm.release.set()
        event, got = await swap, await sample
        return llm, event, got

    llm, event, got = asyncio.run(scenario())
    assert event.ok and llm.pauses == [{"mode": "wait", "clear_cache": True}]
    (request, paused_then), = llm.requests
    assert not paused_then and request["cache_salt"] == "v1"
    assert got.policy_version == 1 and not got.straddles_update


def test_a_request_frozen_mid_prefill_across_an_update_is_marked_straddling():
    """Its tokens all come from the new version (vLLM reports only those), its KV partly
    from the old: only the version it was submitted under tells."""
    async def scenario():
        llm = ScriptedLLM()
        engine = _engine(llm, pause="keep")
        llm.freeze_next = True
        frozen = asyncio.create_task(engine.sample(_prompt()))
        await asyncio.sleep(0.01)
        swap = asyncio.create_task(engine.update(announce(1), WeightSyncConfig()))
        await llm.paused.wait()
        llm.release.set()
        event = await swap
        after = await engine.sample(_prompt())
        return llm, event, await frozen, after

    llm, event, frozen, after = asyncio.run(scenario())
    assert event.ok and llm.pauses == [{"mode": "keep", "clear_cache": False}]
    assert llm.requests[0][0]["cache_salt"] == "v0"
    assert frozen.policy_version == 0 and frozen.straddles_update  # submitted under 0, tokens of 1
    assert after.policy_version == 1 and not after.straddles_update


def test_a_version_missing_a_tensor_is_refused_before_anything_is_pulled():
    llm = ScriptedLLM()
    engine = _engine(llm)
    partial = {k: v for k, v in EXPECTED.items() if k != "model.norm.weight"}
    event = asyncio.run(engine.update(announce(1, partial), WeightSyncConfig()))
    assert not event.ok and "missing model.norm.weight" in event.error
    assert llm.rpcs == [] and engine.version == 0 and llm.label == "0"
    reshaped = dict(EXPECTED, **{"model.norm.weight": [5]})
    event = asyncio.run(engine.update(announce(1, reshaped), WeightSyncConfig()))
    assert not event.ok and "model.norm.weight is float32 [5]" in event.error and llm.rpcs == []


def test_a_load_that_fails_at_the_pause_leaves_the_engine_paused_under_no_version():
    async def scenario():
        llm = ScriptedLLM(commit_error=RuntimeError("out of memory in layer 7"))
        engine = _engine(llm)
        llm.release.set()
        with pytest.raises(EngineBroken, match="may hold parts of versions 0 and 1"):
            await engine.update(announce(1), WeightSyncConfig())
        assert engine.version == -1 and llm.label == "broken" and "layer 7" in engine.broken
        assert not llm.resumed.is_set()  # never resumed: nothing is generated on the half-loaded model
        with pytest.raises(EngineBroken):
            await engine.sample(_prompt())
        with pytest.raises(EngineBroken):
            await engine.update(announce(2), WeightSyncConfig())
        return llm

    llm = asyncio.run(scenario())
    assert not llm.requests and llm.rpcs == ["pull", "dart_commit_update"]
