"""attention.py / flash.py: every kernel against the dense reference (fp32, values and gradients)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.models import flash
from dart_jax.models.attention import attention, dense_attention, resolve, splash_attention
from dart_jax.models.flash import flash_attention
from dart_jax.models.sharding import make_mesh

TOL = 1e-5


def qkv(b, t, s, h, g, d=16, seed=0):
    k = jax.random.split(jax.random.key(seed), 4)
    return (jax.random.normal(k[0], (b, t, h, d)), jax.random.normal(k[1], (b, s, g, d)),
            jax.random.normal(k[2], (b, s, g, d)), jax.random.normal(k[3], (b, t, h, d)))


def decoder_segments(t=300):
    """Row 0 full, row 1 left- and right-padded, row 2 a single token."""
    seg = np.full((3, t), -1, np.int32)
    seg[0], seg[1, 50:187], seg[2, 0] = 0, 0, 0
    return jnp.asarray(seg)


def image_segments(sizes, window=16, pad_every=(13, 16)):
    """Vision slots: images one after another, each window of `window` slots ending in padding."""
    row = []
    for i, n in enumerate(sizes):
        for start in range(0, n, window):
            real = min(pad_every[0], n - start)
            row += [i] * real + [-1] * (window - real)
    return jnp.asarray([row, row[::-1]], jnp.int32)  # the second row: images in reverse order


def check(fn, q, k, v, dout, seg_q, seg_kv, causal, tol=TOL):
    """fn's output and gradients equal dense_attention's at every query that sees a key."""
    valid = np.asarray(seg_q >= 0)[:, :, None, None]
    ref = lambda q, k, v: dense_attention(q, k, v, seg_q, seg_kv, causal=causal)  # noqa: E731
    loss = lambda f: lambda q, k, v: jnp.sum(jnp.where(valid, f(q, k, v) * dout, 0.0))  # noqa: E731
    out, want = fn(q, k, v), ref(q, k, v)
    assert np.abs(np.where(valid, out - want, 0)).max() <= tol
    grads = jax.grad(loss(fn), argnums=(0, 1, 2))(q, k, v)
    for got, exp in zip(grads, jax.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)):
        assert np.abs(got - exp).max() <= tol * max(1.0, float(np.abs(exp).max()))
    assert float(np.abs(grads[1]).max()) > 0.1


@pytest.mark.parametrize("bq,bk", [(64, 32), (37, 50), (512, 512)])
def test_blockwise_causal_padded_gqa_matches_dense(bq, bk):
    q, k, v, dout = qkv(3, 300, 300, h=4, g=2)
    seg = decoder_segments()
    fn = jax.jit(lambda q, k, v: flash_attention(q, k, v, seg, seg, causal=True, block_q=bq, block_k=bk))
    check(fn, q, k, v, dout, seg, seg, causal=True)


@pytest.mark.parametrize("bq,bk", [(64, 64), (48, 80)])
def test_blockwise_images_with_window_padding_match_dense(bq, bk):
    seg = image_segments([70, 130, 40, 9])
    s = seg.shape[1]
    q, k, v, dout = qkv(2, s, s, h=3, g=3)
    fn = jax.jit(lambda q, k, v: flash_attention(q, k, v, seg, seg, causal=False, block_q=bq, block_k=bk))
    check(fn, q, k, v, dout, seg, seg, causal=False)


def test_blockwise_visits_blocks_linear_in_images():
    """Key blocks visited per query block: the image's own blocks, so 5 images cost 5x one."""
    def visited(n_images):
        seg = image_segments([1024] * n_images, window=64, pad_every=(64, 64))
        j0, j1 = flash._span(flash._meets(seg, seg, False, 128, 128))
        return int(jnp.sum(j1 - j0))
    assert visited(1) == 8 * 8 and visited(5) == 5 * visited(1)
    seg = decoder_segments(1024)[:1]
    j0, j1 = flash._span(flash._meets(seg, seg, True, 128, 128))
    assert int(jnp.sum(j1 - j0)) == 8 * 9 // 2  # the causal triangle only


def test_splash_interpret_matches_dense():
    q, k, v, dout = qkv(3, 300, 300, h=4, g=2)
    seg = decoder_segments()
    check(jax.jit(lambda q, k, v: splash_attention(q, k, v, seg, seg, causal=True)), q, k, v, dout, seg, seg, True)
    seg = image_segments([70, 130, 40, 9])
    q, k, v, dout = qkv(2, seg.shape[1], seg.shape[1], h=2, g=1)
    check(jax.jit(lambda q, k, v: splash_attention(q, k, v, seg, seg, causal=False)), q, k, v, dout, seg, seg, False)


def test_splash_under_a_mesh_runs_per_shard():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices")
    q, k, v, dout = qkv(4, 256, 256, h=4, g=2)
    seg = jnp.concatenate([decoder_segments(256), decoder_segments(256)[:1]])
    with jax.set_mesh(make_mesh(data=2, fsdp=2, tp=2)):
        fn = jax.jit(lambda q, k, v: attention(q, k, v, seg, seg, causal=True, impl="splash"))
        check(fn, q, k, v, dout, seg, seg, causal=True)
        assert "shard_map" in str(jax.make_jaxpr(fn)(q, k, v))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_cudnn_matches_dense_on_one_segment_rows(causal):
    q, k, v, dout = (x.astype(jnp.bfloat16) for x in qkv(3, 300, 300, h=4, g=2, d=64))
    seg = decoder_segments()
    fn = jax.jit(lambda q, k, v: attention(q, k, v, seg, seg, causal=causal, impl="cudnn", single_segment=True))
    assert "custom_call" in fn.lower(q, k, v).as_text() or "cudnn" in fn.lower(q, k, v).as_text()
    check(fn, q, k, v, dout, seg, seg, causal=causal, tol=3e-2)  # both sides in bf16


@pytest.mark.parametrize("backend,dtype,kv_len,single,want", [
    ("gpu", jnp.bfloat16, 4096, True, "cudnn"),  # decoder, vision windows
    ("gpu", jnp.bfloat16, 4096, False, "xla"),  # vision full attention: many images a row
    ("gpu", jnp.float32, 4096, True, "xla"),  # cuDNN flash attention has no fp32
    ("tpu", jnp.bfloat16, 4096, False, "splash"),
    ("tpu", jnp.bfloat16, 64, True, "dense"),  # a vision window: below one splash block
    ("cpu", jnp.float32, 4096, True, "xla"),
    ("cpu", jnp.float32, 512, True, "dense"),  # one block of keys
])
def test_auto_picks_the_backends_kernel(backend, dtype, kv_len, single, want):
    assert resolve("auto", dtype=dtype, kv_len=kv_len, single_segment=single, backend=backend) == want


def test_attention_dispatches_long_inputs_to_the_blockwise_path():
    q, k, v, dout = qkv(3, 600, 600, h=4, g=2)
    seg = decoder_segments(600)
    fn = jax.jit(lambda q, k, v: attention(q, k, v, seg, seg, causal=True, impl="xla"))
    assert "while" in str(jax.make_jaxpr(fn)(q, k, v))  # blocks, not [T, S] scores
    check(fn, q, k, v, dout, seg, seg, causal=True)
