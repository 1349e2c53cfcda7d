"""XLA's own memory analysis of the compiled vision tower (CPU, shapes only, no parameters)."""

import jax
import jax.numpy as jnp
from flax import nnx

from dart_jax.models.config import VisionConfig
from dart_jax.agent.image_processing import ImageProcessorConfig
from dart_jax.models.vision import VisionTransformer


UI_TARS = ImageProcessorConfig(min_pixels=100 * 28 * 28, max_pixels=16384 * 28 * 28)


def screenshot_slots(cfg: VisionConfig, h=1080, w=1920) -> int:
    """Slots of one screenshot in the padded window layout (inputs.py), at UI-TARS' resolution."""
    _, gh, gw = UI_TARS.grid_thw(h, w)
    windows = lambda n: -(-(n // cfg.spatial_merge_size) // cfg.window_merged)  # noqa: E731
    return windows(gh) * windows(gw) * cfg.window_patches


def tower_temp_bytes(cfg: VisionConfig, slots: int, remat: str) -> int:
    """Temp bytes of forward + backward (parameter gradients) of the bf16 tower on one row."""
    tower = nnx.eval_shape(lambda: VisionTransformer(cfg, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(tower)

    def loss(p, patches, pos, seg, w_BxMxD):
        out = nnx.merge(graphdef, p)(patches, pos, seg, remat=remat, impl="auto")
        return jnp.sum(out.astype(jnp.float32) * w_BxMxD)

    sds = jax.ShapeDtypeStruct
    args = (sds((1, slots, cfg.patch_dim), jnp.float32), sds((1, slots, 2), jnp.int32), sds((1, slots), jnp.int32),
            sds((1, slots // cfg.merge_unit, cfg.out_hidden_size), jnp.float32))
    compiled = jax.jit(jax.grad(loss)).lower(params, *args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_seven_b_tower_memory_is_linear_in_screenshots():
    """Full-attention blocks attend within each image: five 1920x1080 screenshots in one row
    need at most 5.5x the temp memory of one (a [S, S] score matrix would need 25x)."""
    cfg = VisionConfig()  # UI-TARS-1.5-7B / Qwen2.5-VL-7B tower
    one = screenshot_slots(cfg)
    assert one == 11_520  # 10,764 patches, each 4x4-unit window padded to 64 slots
    for remat in ("none", "full"):
        ratio = tower_temp_bytes(cfg, 5 * one, remat) / tower_temp_bytes(cfg, one, remat)
        assert ratio <= 5.5, (remat, ratio)
