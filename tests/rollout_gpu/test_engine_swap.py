"""The engine's weight swap against a scripted vLLM: no request enters while the swap holds
the engine paused (it would carry the old version's prefix-cache salt into the new weights),
and the `wait` pause clears the prefix cache."""

import asyncio
import types

import numpy as np

from dart_jax.agent.prompt import Prompt
from rollout_gpu.config import EngineConfig, SamplingConfig
from rollout_gpu.engine import Engine


class ScriptedLLM:
    """AsyncLLM's surface the engine uses; `pause_generation` holds until `release` is set."""

    def __init__(self):
        self.release = asyncio.Event()
        self.paused = asyncio.Event()
        self.pauses: list[dict] = []
        self.requests: list[tuple[dict, bool]] = []  # (request, engine paused when it came)

    async def pause_generation(self, *, mode, clear_cache):
        self.pauses.append({"mode": mode, "clear_cache": clear_cache})
        self.paused.set()
        await self.release.wait()

    async def resume_generation(self):
        self.paused.clear()

    async def collective_rpc(self, method, args=()):
        return []

    async def reset_encoder_cache(self):
        pass

    async def update_weight_version(self, version):
        pass

    async def generate(self, request, params, request_id):
        self.requests.append((request, self.paused.is_set()))
        completion = types.SimpleNamespace(token_ids=[7], logprobs=[{7: types.SimpleNamespace(logprob=-0.5)}],
                                           text="x", weight_versions=None)
        yield types.SimpleNamespace(prompt_token_ids=request["prompt_token_ids"], outputs=[completion])


def _prompt() -> Prompt:
    ids = np.asarray([1, 2, 3], np.int32)
    return Prompt(token_ids=ids, placeholder_ids=ids, images=(), image_grid_thw=np.zeros((0, 3), np.int64))


def test_a_sample_asked_for_during_a_swap_waits_for_the_new_version_and_the_wait_pause_clears_the_cache():
    async def scenario():
        llm = ScriptedLLM()
        engine = Engine(llm, EngineConfig(pause="wait"), SamplingConfig(), version=0)

        async def ready(ann, serve):
            return {"state": "ready", "error": ""}
        engine._pull = ready
        swap = asyncio.create_task(engine.update(types.SimpleNamespace(version=1), None))
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
    assert not paused_then and request["cache_salt"] == "v1" and got.policy_version == 1
