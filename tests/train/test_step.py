"""The train step on the tiny policy: sharding, accumulation, old logprobs, SFT."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from dart_jax.models.config import Qwen25VLConfig, TextConfig, VisionConfig
from dart_jax.models.inputs import ModelInputs
from dart_jax.models.qwen25vl import abstract_model
from dart_jax.models.sharding import make_mesh
from dart_jax.testing.trajectories import trajectory
from dart_jax.train.batch import TrainBatch
from dart_jax.train.config import (DualClipLoss, LossConfig, OptimizerConfig, SelectionConfig, TISConfig,
                                   TrainerConfig)
from dart_jax.train import losses, step
from dart_jax.train.prepare import prepare_rl, prepare_sft
from dart_jax.train.optimizer import schedule_of
from dart_jax.train.step import RowTargets, Scores, TrainFunctions, token_scores
from dart_jax.train.trainer import Trainer
from tests.train_batches import collator, examples, layout_inline


@pytest.fixture(scope="module")
def group_trajs(builder):
    """Two tasks x two trajectories x two steps; one success per task."""
    return [trajectory(builder, f"{task}-{i}", task, steps=2, reward=float(i == 0))
            for task in ("t0", "t1") for i in range(2)]


def _mean_grads(acc, mode):
    d = float(acc.counts.of(mode))
    return jax.tree.map(lambda g: np.asarray(g) / d, jax.device_get(acc.grads))


def _assert_close(a, b, atol=1e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, atol=atol)


def test_sharded_step_on_8_devices_matches_one_device(tiny_dir, group_trajs):
    # every RL term is on: selection, TIS, k3 KL (reference pass), GSPO-free dual clip
    # lr 1e-3: AdamW moves each weight by about that much, far past the tolerance the two
    # meshes' weights are compared at, so a wrong update on either mesh shows
    cfg = TrainerConfig(mode="rl", optimizer=OptimizerConfig(lr=1e-3),
                        loss=LossConfig(kl_coef=0.1, policy=DualClipLoss()))
    col = collator(tiny_dir, 4)
    rl = layout_inline(group_trajs, col)
    results = []
    for mesh in (make_mesh(1, 1, 1), make_mesh(data=2, fsdp=2, tp=2)):
        tr = Trainer(cfg, tiny_dir, mesh)
        before = jax.device_get(tr.state.params)
        acc = tr.gradients(prepare_rl(tr.fns, tr.state.params, tr.ref_params, rl, col, cfg))
        grads = _mean_grads(acc, cfg.loss.aggregation)
        metrics = jax.device_get(tr._apply(acc))
        results.append((grads, metrics, jax.device_get(tr.state.params)))
    (g1, m1, p1), (g8, m8, p8) = results
    _assert_close(g1, g8)
    for key in ("loss/total", "loss/policy", "loss/kl", "optim/grad_norm"):
        np.testing.assert_allclose(m8[key], m1[key], atol=1e-5, err_msg=key)
    assert float(m1["optim/grad_norm"]) > 0
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(before)))
    assert moved > 0.5 * cfg.optimizer.lr
    # Adam's first step moves each weight by about lr * sign(g), so a weight whose gradient is
    # near zero turns the meshes' different summation orders into a visible difference: the
    # updates are compared to 5% of one step (a wrong update differs by about a whole step)
    _assert_close(p1, p8, atol=0.05 * cfg.optimizer.lr)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean"])
def test_accumulated_micro_batches_equal_one_batch(tiny_dir, group_trajs, mode):
    """Sums and global counts: micro-batches of 2 and 1 (+1 padding) rows give exactly the
    gradient and loss of one batch of the 3 rows (a mean of means would not)."""
    tr = Trainer(TrainerConfig(mode="sft", loss=LossConfig(aggregation=mode)), tiny_dir,
                 make_mesh(1, 1, 1))
    rows = [e for t in group_trajs[:2] for e in examples(collator(tiny_dir, 4), t)][:3]
    whole = [collator(tiny_dir, 4).collate(rows)]
    halves = [collator(tiny_dir, 2).collate(rows[:2]), collator(tiny_dir, 2).collate(rows[2:])]
    accs = [tr.gradients(prepare_sft(tr.mesh, batches)) for batches in (whole, halves)]
    _assert_close(_mean_grads(accs[0], mode), _mean_grads(accs[1], mode))
    loss = [float(a.sums["loss/total"]) / float(a.counts.of(mode)) for a in accs]
    np.testing.assert_allclose(loss[0], loss[1], rtol=1e-6)


def _rl_cfg(**kw):
    base = dict(mode="rl", optimizer=OptimizerConfig(lr=1e-3), loss=LossConfig(kl_coef=0.0),
                selection=SelectionConfig(enabled=False))
    return TrainerConfig(**{**base, **kw})


def test_old_logprobs_are_the_policy_before_the_batchs_first_update(tiny_dir, group_trajs):
    col = collator(tiny_dir, 4)
    rl = layout_inline(group_trajs, col)
    once = Trainer(_rl_cfg(), tiny_dir, make_mesh(1, 1, 1))
    for _ in range(2):  # a fresh batch each time: old = current policy, ratio exactly 1
        m = jax.device_get(once.update_rl(rl, col))
        assert float(m["loss/ratio"]) == 1.0 and float(m["loss/clip_frac"]) == 0.0
    # no old log-probs scored, no selection: the per-task trace has steps only
    assert [(t.task, t.steps, t.kept, t.tis_weight_pos, t.tis_weight_neg) for t in once.tasks] == [
        ("t0", 4, None, None, None), ("t1", 4, None, None, None)]
    twice = Trainer(_rl_cfg(updates_per_batch=2), tiny_dir, make_mesh(1, 1, 1))
    m = jax.device_get(twice.update_rl(rl, col))  # the second update's metrics
    assert twice.step == 2 and abs(float(m["loss/ratio"]) - 1.0) > 1e-3
    assert twice.fns.compiles["score"] >= 1  # old logprobs came from the no-grad pass
    assert all(t.kept is None and t.tis_weight_pos is not None and t.tis_tokens_neg > 0 for t in twice.tasks)


@pytest.fixture(scope="module")
def _selecting(tiny_dir):
    """One trainer with entropy selection on and its starting state: the selection tests share
    its compiled functions (the scope is prepare_rl's, host-side, read from the cfg it is given)."""
    tr = Trainer(_rl_cfg(selection=SelectionConfig(enabled=True, fraction=0.5)), tiny_dir, make_mesh(1, 1, 1))
    return tr, jax.device_get(tr.state)


@pytest.fixture
def selecting(_selecting):
    """The shared selecting trainer, back at its starting parameters and step 0."""
    tr, start = _selecting
    tr.state = jax.device_put(start, jax.tree.broadcast(tr.fns.state_shardings, start))
    tr.step = 0
    return tr


def _selected(tr, cfg, rl, col):
    """(entropy, weight, injected flag) of each step of `rl` as prepare_rl hands them to the
    loss, and the prepared batch."""
    prepared = prepare_rl(tr.fns, tr.state.params, tr.ref_params, rl, col, cfg)
    out = np.zeros((3, len(rl.reward_N)))
    for m, (mb, rows) in enumerate(zip(prepared.micro, prepared.rows)):
        slots = rl.slot_steps(m)
        for name, i in (("entropy", 0), ("weight", 1), ("injected", 2)):
            x = np.asarray(rows.scores.entropy_N if name == "entropy" else getattr(rows, f"{name}_N"))
            out[i, slots[slots >= 0]] = x[slots >= 0]
    return out, prepared


@pytest.mark.parametrize("scope", ["batch", "balanced"])
def test_entropy_selection_drops_the_lowest_entropy_steps(selecting, tiny_dir, group_trajs, scope):
    """batch: the top half of the 8 steps by the policy's own step entropies; balanced: the
    top one of each (task, sign) cell's two steps, each group's signed weights still summing to
    zero (adv/net 0). The kept steps are checked against the entropies the score pass gave;
    the update then trains on that prepared batch (Trainer.update_rl's one update)."""
    col = collator(tiny_dir, 4)
    rl = layout_inline(group_trajs, col)
    cfg = _rl_cfg(selection=SelectionConfig(enabled=True, fraction=0.5, scope=scope))
    (ent, w, _), prepared = _selected(selecting, cfg, rl, col)
    metrics = jax.device_get(prepared.metrics)
    cells = [np.ones(8, bool)] if scope == "batch" else [
        (rl.group_N == g) & (rl.reward_N == r) for g in np.unique(rl.group_N) for r in (0.0, 1.0)]
    for cell in cells:
        kept, dropped = ent[cell & (w > 0)], ent[cell & (w == 0)]
        assert len(kept) == len(dropped) and kept.min() > dropped.max(), (ent, w)
    assert len(set(np.round(ent, 6))) == 8  # distinct entropies: the order is not a tie's
    if scope == "balanced":
        assert abs(float(metrics["adv/net"])) < 1e-6
    m = jax.device_get(selecting._apply(selecting.gradients(prepared)) | prepared.metrics)
    assert int(m["batch/steps"]) == 8 and float(m["optim/rows"]) == 8
    assert float(m["select/kept_frac"]) == 0.5


def test_the_injected_flag_reaches_selection_and_the_loss(selecting, tiny_dir, group_trajs):
    """Task t0's success comes from the pool (CuratedBatch.injected): both its steps are kept
    however low their entropy and marked for the loss (rows.injected_N); without the flag the
    same batch drops one of them (fraction 0.5, one kept step of each two-step cell)."""
    col = collator(tiny_dir, 4)
    cfg = _rl_cfg(selection=SelectionConfig(enabled=True, fraction=0.5, scope="balanced"))
    pooled = group_trajs[0].traj_id
    flagged = layout_inline(group_trajs, col, injected=(pooled,))
    (_, w, inj), _ = _selected(selecting, cfg, flagged, col)
    own = np.array([flagged.trajectories[t].traj_id == pooled for t in flagged.traj_N])
    assert own.sum() == 2 and (w[own] > 0).all() and (inj == own).all()
    (_, w_plain, inj_plain), _ = _selected(selecting, cfg, layout_inline(group_trajs, col), col)
    assert (w_plain[own] > 0).sum() == 1 and not inj_plain.any()


def test_the_per_task_trace_has_selections_kept_steps_and_the_losss_tis_weights(selecting, tiny_dir, group_trajs):
    """Trainer.tasks after an update: each task's steps and the ones selection kept (its
    weights > 0 as prepare_rl hands them to the loss), and its mean TIS weight by the
    advantage's sign, host-side; their token-weighted means over the tasks are the compiled
    step's batch-wide tis/weight_{pos,neg} (no demos, no injected steps here)."""
    col = collator(tiny_dir, 4)
    rl = layout_inline(group_trajs, col)
    (_, w, _), _ = _selected(selecting, selecting.cfg, rl, col)  # at the parameters update_rl starts from
    m = jax.device_get(selecting.update_rl(rl, col))
    tasks = selecting.tasks
    assert [(t.task, t.steps) for t in tasks] == [("t0", 4), ("t1", 4)]
    assert [t.kept for t in tasks] == [int((w[rl.group_N == g] > 0).sum()) for g in (0, 1)] == [2, 2]
    for sign in ("pos", "neg"):
        n = [getattr(t, f"tis_tokens_{sign}") for t in tasks]
        means = [getattr(t, f"tis_weight_{sign}") for t in tasks]
        assert min(n) > 0 and all(0 < x <= selecting.cfg.tis.cap for x in means)
        np.testing.assert_allclose(np.dot(n, means) / sum(n), float(m[f"tis/weight_{sign}"]), rtol=1e-4)
    record = tasks[0].record()
    assert record["kept_frac"] == 0.5 and record["task"] == "t0" and json.loads(json.dumps(record)) == record


def test_packed_rows_score_and_train_each_step_as_its_own_row_does(tiny_dir, group_trajs):
    """Two steps a row (each its own sequence in the decoder, its screenshots frames of the row,
    its positions from 0) against one step a row, same buckets: every step's log-probs, the
    loss, TIS and entropy sums, the counts, entropy selection and the gradient agree."""
    cfg = _rl_cfg(updates_per_batch=2, selection=SelectionConfig(enabled=True, fraction=0.5))
    tr = Trainer(cfg, tiny_dir, make_mesh(1, 1, 1))  # updates_per_batch=2: old log-probs scored
    results = []
    for pack in (1, 2):
        col = collator(tiny_dir, 2, seq_lens=(2048,), num_slots=(3072,), pack=pack)
        rl = layout_inline(group_trajs[:2], col)  # one task: a success and a failure, two steps each
        steps = [r for rows in rl.layout for row in rows for r in row]
        prepared = prepare_rl(tr.fns, tr.state.params, tr.ref_params, rl, col, cfg)
        logp = {}
        for m, (mb, targets) in enumerate(zip(prepared.micro, prepared.rows)):
            mask_NxT = np.asarray(mb.loss_mask_BxPxT).reshape(-1, 2048)
            old_NxT = np.asarray(targets.scores.logp_old_NxT)
            for slot, k in enumerate(rl.slot_steps(m)):
                if k >= 0:
                    logp[steps[k].traj, steps[k].step] = old_NxT[slot][mask_NxT[slot] > 0]
        results.append((rl, logp, jax.device_get(tr.gradients(prepared)), jax.device_get(prepared.metrics)))
    (single, logp1, acc1, m1), (packed, logp2, acc2, m2) = results
    assert [len(row) for rows in single.layout for row in rows] == [1, 1, 1, 1]
    assert [len(row) for rows in packed.layout for row in rows] == [2, 2]  # one microbatch
    assert sorted(logp1) == sorted(logp2) and len(logp1) == 4
    for key in logp1:
        np.testing.assert_allclose(logp2[key], logp1[key], atol=1e-5, err_msg=str(key))
    assert sorted(acc1.sums) == sorted(acc2.sums)
    for key in acc1.sums:
        np.testing.assert_allclose(acc2.sums[key], acc1.sums[key], rtol=1e-5, atol=1e-5, err_msg=key)
    np.testing.assert_allclose(acc2.mismatch, acc1.mismatch, rtol=1e-5, atol=1e-5)
    assert (acc1.counts.tokens, acc1.counts.seqs) == (acc2.counts.tokens, acc2.counts.seqs)
    assert float(acc1.counts.seqs) == 4  # every step counts; selection's rescale is the one compensation
    assert float(m1["select/kept_frac"]) == 0.5
    for key in ("select/threshold", "select/entropy_kept", "select/entropy_dropped"):
        np.testing.assert_allclose(m2[key], m1[key], rtol=1e-5, err_msg=key)
    _assert_close(acc1.grads, acc2.grads)


@pytest.mark.parametrize("schedule,want", [
    ("constant", [0.0, 0.5, 1.0, 1.0, 1.0]),  # 2 warmup steps, then flat
    ("linear", [0.0, 0.5, 1.0, 0.5, 0.0]),  # to 0 at total_steps = 4
    ("cosine", [0.0, 0.5, 1.0, 0.5, 0.0]),
])
def test_schedules(schedule, want):
    lr = schedule_of(OptimizerConfig(lr=1.0, schedule=schedule, warmup_steps=2, total_steps=4))
    np.testing.assert_allclose([float(lr(i)) for i in range(5)], want, atol=1e-6)


def test_bf16_compute_keeps_fp32_master_weights(tiny_dir, group_trajs):
    tr = Trainer(TrainerConfig(mode="sft", compute_dtype="bfloat16"), tiny_dir, make_mesh(1, 1, 1))
    batch = collator(tiny_dir, 4).collate(examples(collator(tiny_dir, 4), group_trajs[0])[:2])
    m = jax.device_get(tr.update_sft([batch]))
    assert np.isfinite(m["loss/total"]) and m["optim/grad_norm"] > 0
    assert {x.dtype for x in jax.tree.leaves(tr.state.params)} == {np.dtype("float32")}


# ---- compiled-program facts (XLA's own analysis of the accumulate step, shapes only) ----

def _abstract_step(layers: int, remat: str, rows=2, seq_len=2048):
    """TrainFunctions' compiled `accumulate` (forward + backward of the SFT loss) of a 256-wide decoder."""

    text = TextConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, mrope_section=(8, 12, 12))
    vision = VisionConfig(depth=1, hidden_size=64, intermediate_size=64, num_heads=2, out_hidden_size=256,
                          fullatt_block_indexes=(0,))
    graphdef, params = abstract_model(Qwen25VLConfig(text=text, vision=vision))
    fns = TrainFunctions(graphdef, params, TrainerConfig(mode="sft", remat=remat), make_mesh(1, 1, 1))
    sds = jax.ShapeDtypeStruct
    i32, f32 = np.int32, np.float32
    BxT, BxP, B = (rows, seq_len), (rows, 1), (rows,)
    inputs = ModelInputs(sds(BxT, i32), sds(BxT, i32), sds((3,) + BxT, i32))
    mb = TrainBatch(inputs, sds(BxT, i32), sds((rows, 1, seq_len), f32), sds((rows, 1, seq_len), f32),
                    sds(BxP, f32), sds(BxP, i32), sds(BxP, i32), sds(BxP, f32), sds(BxP, f32), sds(BxP, i32),
                    sds(BxP, np.bool_))
    row_targets = RowTargets(sds(B, f32), sds(B, f32), Scores(None, None, None))
    params = jax.tree.map(lambda x: sds(x.shape, x.dtype), params)
    acc = fns.accumulator_shapes(params, mb, row_targets)
    return fns.compile_accumulate(params, acc, mb, row_targets)


def test_remat_full_keeps_a_small_fraction_of_the_activations():
    """16 scanned layers, 2 x 2048 tokens: with `remat: full` only each layer's input lives
    until the backward (XLA memory analysis: ~14% of `none`), `dots` sits in between."""
    temp = {r: _abstract_step(16, r).memory_analysis().temp_size_in_bytes for r in ("none", "dots", "full")}
    assert temp["full"] <= 0.2 * temp["none"], temp
    assert temp["full"] < temp["dots"] < temp["none"], temp


def test_compiled_step_does_not_grow_with_depth():
    """Layers run under one scan: the 2- and 16-layer programs have the same instructions, so
    compile time does not depend on depth (benchmarks/gpu/train_step.py reports the times)."""
    def instructions(layers):
        return sum(" = " in line for line in _abstract_step(layers, "full").as_text().splitlines())
    two, sixteen = instructions(2), instructions(16)
    assert abs(sixteen - two) <= 0.01 * two, (two, sixteen)


def test_the_step_programs_are_named_for_what_they_do():
    """XLA's logs, dumps and profiles name the program `jit_train_accumulate`, not a lambda's."""
    assert _abstract_step(2, "full").as_text().startswith("HloModule jit_train_accumulate")


@pytest.mark.parametrize("normalize", ["step", "trajectory"])
def test_an_rl_update_favours_the_successes_over_the_failures(tiny_dir, group_trajs, normalize):
    """The sign of the whole RL path (plan, advantages, loss, optimizer): after one update on
    a batch, the log-likelihood of each task's successful responses rose by more than that
    of its failed ones (all may move together: Adam's first step moves every weight)."""
    cfg = _rl_cfg(loss=LossConfig(kl_coef=0.0, advantage_normalize=normalize), tis=TISConfig(enabled=False))
    col = collator(tiny_dir, 4)
    rl = layout_inline(group_trajs, col)
    tr = Trainer(cfg, tiny_dir, make_mesh(1, 1, 1))

    def loglik_per_step() -> np.ndarray:
        micro = prepare_rl(tr.fns, tr.state.params, tr.ref_params, rl, col, cfg).micro
        out = np.zeros(len(rl.reward_N))
        for m, mb in enumerate(micro):
            logp, _ = token_scores(tr.fns.graphdef, tr.state.params, mb, cfg)
            per_slot = np.asarray((logp * mb.loss_mask_BxPxT.reshape(logp.shape)).sum(-1))
            steps = rl.slot_steps(m)
            out[steps[steps >= 0]] = per_slot[steps >= 0]
        return out

    before = loglik_per_step()
    tr.update_rl(rl, col)
    delta = loglik_per_step() - before
    for group in np.unique(rl.group_N):
        won, lost = (delta[(rl.group_N == group) & (rl.reward_N == r)].mean() for r in (1.0, 0.0))
        assert won > lost, (group, won, lost)


@pytest.fixture(scope="module")
def clip_batch(tiny_dir, group_trajs):
    """One micro-batch of both tasks' steps, its row targets, the trainer, its log-probs and
    the jitted gradient of step.rl_loss (the config static)."""
    cfg = _rl_cfg(loss=LossConfig(kl_coef=0.0, aggregation="seq_mean_token_mean"), tis=TISConfig(enabled=False))
    col = collator(tiny_dir, 8)
    tr = Trainer(cfg, tiny_dir, make_mesh(1, 1, 1))
    prepared = prepare_rl(tr.fns, tr.state.params, tr.ref_params, layout_inline(group_trajs, col), col, cfg)
    assert len(prepared.micro) == 1
    mb, rows = prepared.micro[0], prepared.rows[0]
    logp, _ = token_scores(tr.fns.graphdef, tr.state.params, mb, cfg)
    # the loss's gradient compiled once per config (clip_to, TIS) and shared by the cases
    grad_fn = jax.jit(jax.grad(lambda c, p, b, r: step.rl_loss(tr.fns.graphdef, c, p, b, r), argnums=1,
                               has_aux=True), static_argnums=0)
    return cfg, tr, mb, rows, np.asarray(logp), grad_fn


def _clip_case(clip_batch, clip_to: str, up: float, down: float, tis: bool = False, injected: bool = False):
    """step.rl_loss at the trainer's parameters on the batch with its sampler log-probs set so
    that each token's ratio pi_now / pi_behaviour is `up` where A > 0 and `down` where A < 0
    (the policy moved since it sampled them); returns (loss sums with UNIT denominators and
    the token count, gradient, advantages, weights)."""
    cfg, tr, mb, rows, logp, grad_fn = clip_batch
    cfg = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, clip_to=clip_to),
                              tis=TISConfig(enabled=tis, cap=2.0))
    rows = dataclasses.replace(rows, injected_N=rows.weight_N * float(injected))
    adv = np.asarray(rows.adv_N)
    shift = np.where(adv > 0, np.log(up), np.log(down))[:, None]  # log pi_now - log pi_behaviour
    mask = np.asarray(mb.loss_mask_BxPxT)
    behaviour = (logp - shift).reshape(mask.shape) * mask
    mb = dataclasses.replace(mb, rollout_logp_BxPxT=behaviour.astype(np.float32))
    grads, (sums, _, signs, counts) = grad_fn(cfg, tr.state.params, mb, rows)
    sums = {k: float(v) for k, v in jax.device_get(sums).items()} | {"tokens": float(counts.tokens)}
    sums |= {k: float(v) for k, v in jax.device_get(losses.sign_metrics(signs)).items()}
    return sums, jax.device_get(grads), adv, np.asarray(rows.weight_N)


def test_the_clip_acts_when_the_behaviour_policy_differs(clip_batch):
    """clip_to behaviour: every token's ratio to the policy that sampled it is past the clip
    (1.5 > 1 + 0.28 with A > 0, 1 / 1.2 < 1 - 0.1 with A < 0): every token counts as clipped,
    the policy gradient is exactly zero, and each token's loss is the clipped value scaled to
    the trainer's ratio (r = 1): -1.28 A / 1.5 where A > 0, 0.9 |A| * 1.2 where A < 0."""
    sums, grads, adv, w = _clip_case(clip_batch, "behaviour", 1.5, 1 / 1.2)
    want = np.sum(w * np.where(adv > 0, -1.28 * adv / 1.5, 0.9 * 1.2 * np.abs(adv)))  # per-step token means
    np.testing.assert_allclose(sums["loss/policy"], want, rtol=1e-5)
    assert sums["tokens"] > 0 and sums["loss/clip_frac"] == sums["tokens"]
    assert all(float(np.max(np.abs(g))) == 0.0 for g in jax.tree.leaves(grads))


def test_inside_the_behaviour_clip_the_gradient_is_the_trainers(clip_batch):
    """Ratios 1.1 and 1 / 1.05 to the behaviour policy are inside the clip: nothing is clipped,
    and loss and gradient are those of the trainer's own ratio (-sum w A; the same gradient
    as clip_to trainer, which never clips with one update per batch, whatever the sampler)."""
    inside, g_inside, adv, w = _clip_case(clip_batch, "behaviour", 1.1, 1 / 1.05)
    trainer, g_trainer, _, _ = _clip_case(clip_batch, "trainer", 1.5, 1 / 1.2)
    assert inside["loss/clip_frac"] == 0.0 and trainer["loss/clip_frac"] == 0.0
    assert trainer["loss/ratio"] == trainer["tokens"]  # against itself: exactly 1
    for sums in (inside, trainer):
        np.testing.assert_allclose(sums["loss/policy"], -np.sum(w * adv), atol=1e-5)
    assert max(float(np.max(np.abs(g))) for g in jax.tree.leaves(g_trainer)) > 0
    _assert_close(g_inside, g_trainer, atol=1e-6)


def test_with_tis_the_behaviour_clip_zeroes_success_tokens_ahead_of_the_sampler(clip_batch):
    """TIS on (cap 2), the behaviour clip: q = 1.5 on success tokens is past 1.28, so they are
    clipped and get no push; failure tokens at q = 1.6 are inside and keep weight 1.6: the
    token-level push is all the failures' (push/net -1) though adv/net is 0."""
    sums, grads, adv, w = _clip_case(clip_batch, "behaviour", 1.5, 1.6, tis=True)
    assert sums["loss/clip_frac_pos"] == 1.0 and sums["loss/clip_frac_neg"] == 0.0
    np.testing.assert_allclose([sums["tis/weight_pos"], sums["tis/weight_neg"]], [1.5, 1.6], rtol=1e-5)
    np.testing.assert_allclose(sums["push/net"], -1.0, atol=1e-6)
    assert max(float(np.max(np.abs(g))) for g in jax.tree.leaves(grads)) > 0


def test_with_tis_the_recipe_weights_both_signs_alike(clip_batch):
    """TIS on (cap 2), the clip against pi_old: q = 1.5 and 2.5 weigh 1.5 and 2 whatever the
    sign; nothing is clipped; the policy term is -sum w A min(q, 2) (per-step token means)."""
    sums, _, adv, w = _clip_case(clip_batch, "trainer", 1.5, 2.5, tis=True)
    assert sums["loss/clip_frac_pos"] == 0.0 and sums["loss/clip_frac_neg"] == 0.0
    np.testing.assert_allclose([sums["tis/weight_pos"], sums["tis/weight_neg"]], [1.5, 2.0], rtol=1e-5)
    np.testing.assert_allclose(sums["loss/policy"], -np.sum(w * adv * np.where(adv > 0, 1.5, 2.0)), rtol=1e-5)


def test_injected_steps_keep_their_push_under_tis_and_the_behaviour_clip(clip_batch):
    """Every step flagged injected: the stale sampler log-probs (q = 1.5 and 1 / 1.2, which the
    behaviour clip would zero) are ignored; weight 1, nothing clipped, gradient that of -sum w A."""
    sums, grads, adv, w = _clip_case(clip_batch, "behaviour", 1.5, 1 / 1.2, tis=True, injected=True)
    assert sums["loss/clip_frac"] == 0.0
    np.testing.assert_allclose([sums["tis/weight_pos"], sums["tis/weight_neg"]], [1.0, 1.0])
    np.testing.assert_allclose(sums["loss/policy"], -np.sum(w * adv), atol=1e-5)
    assert max(float(np.max(np.abs(g))) for g in jax.tree.leaves(grads)) > 0
