from dart_jax.train.batch import BucketSpec
from dart_jax.train.config import TrainerConfig


def test_default_trainer_buckets_are_a_valid_bucket_spec():
    b = TrainerConfig().buckets
    spec = BucketSpec(b.seq_lens, b.num_slots, b.rows)
    assert spec.seq_lens == tuple(sorted(b.seq_lens)) and spec.rows == b.rows
