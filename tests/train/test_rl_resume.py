"""RL resume end to end: a trainer killed mid-run and started again trains on the same
curated batches, to the same weights and optimizer state, with the same losses, as a trainer
that was never interrupted.

Two data managers start from copies of one store (rollouts of two tasks, both outcomes);
trainer A runs `dart-jax train` uninterrupted, trainer B is SIGKILLed after a checkpoint
and started again. The data manager replays every batch it handed out after B's cursor,
so B's steps after its checkpoint see A's batches. The trainer's config has every RL term
on (k3 KL to the starting policy, entropy selection, TIS), so its losses depend on the
weights, the reference and the batch; the exported weights and the last checkpoint's
optimizer moments are compared too: a resume that lost Adam's moments, the step count or
the reference shows there even where a loss term would not.
"""

import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors.numpy import load_file

from dart_jax.train.config import CheckpointConfig
from dart_jax.train.config import TrainerConfig
from tests.train import dm_store
from tests.train.dm_store import records, train
from tests.procs import kill_when

pytestmark = pytest.mark.slow
STEPS, EVERY = 6, 2
COMPARED = ("loss/", "tis/", "select/", "adv/", "optim/", "batch/")  # every term an update computes
# same program, same inputs, same machine: the resumed run computes the same numbers; a lost
# Adam moment or a skipped step moves weights by about the lr (1e-4), far past this
ATOL = 1e-6


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    dm_store.fill(root)
    return root


def _start(tmp_path, name: str, store, tiny_dir):
    return dm_store.rl_trainer(tmp_path, name, store, tiny_dir, TrainerConfig(steps=STEPS, export=True),
                               CheckpointConfig(every_steps=EVERY, async_save=False))


def _checkpoint(run_dir, step: int) -> dict:
    """The saved train state of `step` as host arrays, by path ("params/...", "opt_state/mu/...")."""
    with ocp.CheckpointManager(run_dir / "checkpoints", item_names=("state", "meta")) as mgr:
        got = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    leaves = ocp.tree.to_flat_dict(got, sep="/")
    return {k: np.asarray(v) for k, v in leaves.items()}


def _export(run_dir, step: int) -> dict[str, np.ndarray]:
    out = {}
    for f in sorted((run_dir / "export" / f"step-{step}").glob("*.safetensors")):
        out |= load_file(f)
    return out


def _assert_same_arrays(a: dict, b: dict, what: str) -> None:
    assert sorted(a) == sorted(b) and a, what
    for k in a:
        np.testing.assert_allclose(a[k], b[k], atol=ATOL, rtol=0, err_msg=f"{what}: {k}")


def test_a_killed_rl_trainer_resumes_to_the_same_weights_optimizer_state_and_losses(tmp_path, store, tiny_dir):
    whole_cfg, stop_a = _start(tmp_path, "whole", store, tiny_dir)
    killed_cfg, stop_b = _start(tmp_path, "killed", store, tiny_dir)
    try:
        whole, killed = train(whole_cfg), train(killed_cfg)
        kill_when(killed, lambda: (tmp_path / "killed" / "checkpoints" / str(EVERY * 2)).exists())
        before = records(tmp_path / "killed")
        resumed = train(killed_cfg)
        assert resumed.wait(600) == 0, resumed.stderr.read()[-3000:]
        assert whole.wait(600) == 0, whole.stderr.read()[-3000:]
    finally:
        stop_a.set()
        stop_b.set()
    reference = {r["step"]: r for r in records(tmp_path / "whole")}
    assert sorted(reference) == list(range(1, STEPS + 1))
    after = records(tmp_path / "killed")
    assert [r["step"] for r in after[len(before):]] == list(range(EVERY * 2 + 1, STEPS + 1))  # from step 4's checkpoint
    for r in after:  # every step, before the kill and after the restart
        want = reference[r["step"]]
        assert r["batch/id"] == want["batch/id"], r["step"]
        terms = sorted(k for k in want if k.startswith(COMPARED))
        assert sorted(k for k in r if k.startswith(COMPARED)) == terms
        assert {"loss/policy", "loss/kl", "loss/total", "optim/grad_norm", "tis/abs_delta_logp"} <= set(terms)
        for k in terms:
            assert r[k] == pytest.approx(want[k], abs=ATOL), (r["step"], k)
    versions = [r["policy/version"] for r in after]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)  # a restart never reuses one

    whole_state, killed_state = (_checkpoint(tmp_path / name, STEPS) for name in ("whole", "killed"))
    assert any(k.startswith("opt_state/") for k in whole_state)
    _assert_same_arrays(whole_state, killed_state, "checkpoint")  # params, Adam's moments and count, step
    _assert_same_arrays(_export(tmp_path / "whole", STEPS), _export(tmp_path / "killed", STEPS), "export")
