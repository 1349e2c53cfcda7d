"""Trajectories -> TrainBatch: next-token alignment, exact pixel values, buckets, dropped examples."""

import numpy as np
import pytest

from dart_jax.models.inputs import make_inputs
from dart_jax.testing.trajectories import trajectory
from dart_jax.train.batch import Bucket, BucketSpec, StepShape, TrainBatch
from dart_jax.train.collate import Collator, align_step
from dart_jax.train.screens import InlineScreens, decode_png
from tests.train_batches import examples

SPEC = BucketSpec(seq_lens=(1024, 768), num_slots=(1536, 768), rows=4)


@pytest.fixture(scope="module")
def collator(tiny_dir):
    return Collator.from_pretrained(tiny_dir, SPEC)


@pytest.fixture(scope="module")
def traj(builder):
    return trajectory(builder, "traj-a", "task-a", steps=3, reward=1.0, version=5, temperature=0.7)


def test_align_step_is_exact():
    ids, targets, mask, logp = align_step(np.array([7, 8, 9], np.int32), np.array([4, 5], np.int32),
                                          np.array([-0.5, -0.25], np.float32))
    assert ids.tolist() == [7, 8, 9, 4, 5]
    assert targets.tolist() == [8, 9, 4, 5, 0]
    assert mask.tolist() == [0, 0, 1, 1, 0]
    assert logp.tolist() == [0, 0, -0.5, -0.25, 0]
    with pytest.raises(ValueError, match="1 logprobs for 2"):
        align_step(np.array([1]), np.array([4, 5]), np.array([0.0], np.float32))


def test_examples_align_prompt_response_and_sampler_logprobs(collator, traj, builder):
    for step, ex in zip(traj.steps, examples(collator, traj), strict=True):
        p, r = len(step.prompt_ids), len(step.response_ids)
        np.testing.assert_array_equal(ex.input_ids_T, np.concatenate([step.prompt_ids, step.response_ids]))
        on = np.flatnonzero(ex.loss_mask_T)
        assert on.tolist() == list(range(p - 1, p + r - 1))
        np.testing.assert_array_equal(ex.targets_T[on], step.response_ids)
        np.testing.assert_array_equal(ex.rollout_logp_T[on], step.logprobs)
        assert ex.targets_T[-1] == 0 and not ex.rollout_logp_T[ex.loss_mask_T == 0].any()
        assert ex.targets_T[on[-1]] == builder.im_end_id  # the response ends with <|im_end|>
        assert (ex.reward, ex.temperature, ex.policy_version, ex.is_demo) == (1.0, np.float32(0.7), 5, False)
        grids = [builder.image_cfg.grid_thw(*np.asarray(decode_png(traj.screenshots[r])).shape[:2])
                 for r in step.image_refs]  # what the prompt builder expanded the image pads by
        assert ex.image_grid_thw_Ix3.tolist() == [list(g) for g in grids]


def test_pixel_values_equal_transformers_processor(collator, traj, tiny_dir):
    proc = pytest.importorskip("transformers").AutoImageProcessor.from_pretrained(tiny_dir)
    step = traj.steps[2]
    images = [decode_png(traj.screenshots[r]) for r in step.image_refs]
    ref = proc(images=images, return_tensors="np")
    ex = examples(collator, traj, [2])[0]
    assert ex.pixel_values_NxD.dtype == np.float32
    np.testing.assert_array_equal(ex.pixel_values_NxD, np.asarray(ref["pixel_values"], np.float32))
    np.testing.assert_array_equal(ex.image_grid_thw_Ix3, np.asarray(ref["image_grid_thw"]))


def test_shape_from_screenshot_sizes_equals_the_layout_make_inputs_builds(collator, traj):
    refs = InlineScreens([traj]).refs(0)
    for i, ex in enumerate(examples(collator, traj)):
        assert collator.shape(traj, i, refs) == StepShape(ex.seq_len, ex.num_slots)
        natural = make_inputs(collator.config, ex.input_ids_T[None], None, ex.pixel_values_NxD,
                              ex.image_grid_thw_Ix3)
        assert natural.pixel_values.shape[1] == ex.num_slots


def test_collate_pads_rows_tokens_and_slots_to_the_bucket(collator, traj, builder):
    other = trajectory(builder, "traj-b", "task-b", steps=1, reward=0.0, source="demo")
    rows = examples(collator, traj) + examples(collator, other)
    batch = collator.collate(rows[1:])  # 3 real rows of a 4-row bucket
    longest = max(e.seq_len for e in rows[1:])
    assert longest > 768 and 768 < max(e.num_slots for e in rows[1:]) <= 1536
    assert isinstance(batch, TrainBatch) and batch.rows == 4
    assert batch.targets_BxT.shape == (4, 1024) and batch.inputs.pixel_values.shape[:2] == (4, 1536)
    assert batch.inputs.position_ids.shape == (3, 4, 1024)
    assert batch.step_weight_BxP.tolist() == [[1], [1], [1], [0]]  # one step slot a row
    assert batch.group_BxP[:, 0].tolist() == [0, 0, 1, 0] and batch.traj_BxP[:, 0].tolist() == [0, 0, 1, 0]
    assert batch.reward_BxP[:, 0].tolist() == [1, 1, 0, 0]
    assert batch.is_demo_BxP[:, 0].tolist() == [False, False, True, False]
    assert batch.policy_version_BxP[:, 0].tolist() == [5, 5, 0, 0]
    np.testing.assert_allclose(batch.temperature_BxP[:, 0], [0.7, 0.7, 1.0, 0.0])
    for k, ex in enumerate(rows[1:]):
        t = ex.seq_len
        np.testing.assert_array_equal(batch.inputs.input_ids[k, :t], ex.input_ids_T)
        assert batch.inputs.attention_mask[k].sum() == t and not batch.inputs.input_ids[k, t:].any()
        np.testing.assert_array_equal(batch.targets_BxT[k, :t], ex.targets_T)
        np.testing.assert_array_equal(batch.loss_mask_BxPxT[k, 0, :t], ex.loss_mask_T)
        np.testing.assert_array_equal(batch.rollout_logp_BxPxT[k, 0, :t], ex.rollout_logp_T)
        assert not batch.loss_mask_BxPxT[k, 0, t:].any()
        alone = make_inputs(collator.config, ex.input_ids_T[None], None, ex.pixel_values_NxD,
                            ex.image_grid_thw_Ix3, num_slots=1536)  # the row as a batch of its own
        np.testing.assert_array_equal(batch.inputs.position_ids[:, k, :t], alone.position_ids[:, 0])
        np.testing.assert_array_equal(batch.inputs.pixel_values[k], alone.pixel_values[0])
        np.testing.assert_array_equal(batch.inputs.vision_segment_ids[k], alone.vision_segment_ids[0])
        np.testing.assert_array_equal(batch.inputs.image_token_index[k, :t], alone.image_token_index[0])
    assert not batch.inputs.attention_mask[3].any() and not batch.loss_mask_BxPxT[3].any()
    assert (batch.inputs.vision_segment_ids[3] == -1).all()


def test_packed_rows_hold_each_step_as_its_own_row_would(traj, builder, tiny_dir):
    """Two steps share row 0 back to back: the attention mask numbers them, each one's positions,
    image layout and targets are those of its own row, and its step slot holds its loss mask and
    per-step values at its own positions only."""
    col = Collator.from_pretrained(tiny_dir, BucketSpec(seq_lens=(1024, 2048), num_slots=(1536, 3072), rows=2, pack=3))
    other = trajectory(builder, "traj-b", "task-b", steps=1, reward=0.0, source="demo")
    a, b = examples(col, traj, [0, 1])
    (c,) = examples(col, other)
    n = a.seq_len
    packed = col.collate_rows([[a, c], [b]])  # the smallest bucket holding a + c
    assert packed.rows == 2 and 1024 < n + c.seq_len <= packed.targets_BxT.shape[1] == 2048
    alone = col.collate([a, c], Bucket(2048, 3072, 2, 3))  # each its own row
    assert packed.inputs.packed and alone.inputs.packed  # pack > 1: every batch of this collator
    assert packed.inputs.attention_mask[0].tolist() == [1] * n + [2] * c.seq_len + [0] * (2048 - n - c.seq_len)
    np.testing.assert_array_equal(packed.inputs.input_ids[0, :n + c.seq_len],
                                  np.concatenate([a.input_ids_T, c.input_ids_T]))
    np.testing.assert_array_equal(packed.inputs.image_token_index[0, :n], alone.inputs.image_token_index[0, :n])
    np.testing.assert_array_equal(packed.inputs.position_ids[:, 0, :n], alone.inputs.position_ids[:, 0, :n])
    np.testing.assert_array_equal(packed.inputs.position_ids[:, 0, n:n + c.seq_len],
                                  alone.inputs.position_ids[:, 1, :c.seq_len])  # from 0 again
    np.testing.assert_array_equal(packed.targets_BxT[0, n:n + c.seq_len], c.targets_T)
    # step slots: (0, 0) = a, (0, 1) = c at positions n.., (1, 0) = b; the rest empty
    assert packed.step_weight_BxP.tolist() == [[1, 1, 0], [1, 0, 0]]
    assert packed.is_demo_BxP.tolist() == [[False, True, False], [False, False, False]]
    np.testing.assert_array_equal(packed.loss_mask_BxPxT[0, 1, n:n + c.seq_len], c.loss_mask_T)
    assert not packed.loss_mask_BxPxT[0, 1, :n].any() and not packed.loss_mask_BxPxT[0, 0, n:].any()
    np.testing.assert_array_equal(packed.rollout_logp_BxPxT[1, 0, :b.seq_len], b.rollout_logp_T)
    # the images of both steps of row 0 are frames of that row, in order
    frames = packed.inputs.vision_segment_ids[0]
    assert len(set(frames[frames >= 0].tolist())) == len(a.image_grid_thw_Ix3) + len(c.image_grid_thw_Ix3)
    with pytest.raises(ValueError, match="rows of 1..3 steps"):
        col.collate_rows([[a, b, c, a]], Bucket(8192, 6144, 2, 3))


def test_train_batch_is_a_pytree(collator, traj):
    import jax
    batch = collator.collate(examples(collator, traj, [0]))
    leaves = jax.tree.leaves(batch)
    assert len(leaves) == 7 + 10
    doubled = jax.tree.map(lambda x: x, batch)
    assert isinstance(doubled, TrainBatch) and doubled.inputs.input_ids.shape == (4, 768)


def test_buckets_choose_the_smallest_fit_and_drop_what_fits_none(tiny_dir):
    spec = BucketSpec(seq_lens=(512, 128), num_slots=(64, 128), rows=2)
    assert spec.seq_lens == (128, 512)
    small, wide, long = StepShape(100, 64), StepShape(129, 70), StepShape(513, 64)
    assert spec.choose_bucket([small]) == Bucket(128, 64, 2)
    assert spec.choose_bucket([small, wide]) == Bucket(512, 128, 2)
    collator = Collator.from_pretrained(tiny_dir, spec)
    assert collator.fit([small, long, wide, StepShape(10, 129)]) == [small, wide]
    assert collator.dropped == 2
    with pytest.raises(ValueError, match="largest bucket"):
        spec.choose_bucket([long])
    with pytest.raises(ValueError, match="1..2 examples"):
        spec.choose_bucket([small] * 3)
    with pytest.raises(ValueError, match="multiples of 64"):
        Collator.from_pretrained(tiny_dir, BucketSpec((128,), (100,), 1))
