"""`dart-jax plan CONFIG`: what the run's trainer holds on each chip, before a chip is rented.

    dart-jax plan configs/tpu/v5p-64.yaml            # the table, and a WARNING line if it does not fit
    dart-jax plan configs/tpu/v5p-64.yaml --strict   # exit 1 when it does not fit

Sizes come from the policy's config.json (`policy.hf_dir`, or `plan.model_config` when that
directory is empty or not on this machine), the model's own parameter list sharded by the one
sharding table (models/sharding.py), and the trainer settings. Per chip, with c the compute
dtype's bytes, P this chip's share of the parameters, R the rows this chip holds of one
micro-batch (rows per host x hosts, split over the batch's data*fsdp shards), T the largest
`buckets.seq_lens` and S the largest `buckets.num_slots`:

  parameters      4P   fp32 master weights
  gradients       4P   the fp32 accumulator of gradient sums (each micro-batch adds into it)
  optimizer       8P   AdamW mu and nu, fp32
  reference       4P   the frozen reference policy, when mode is rl and kl_coef > 0
  text act.       per layer and token, in elements of c bytes (D hidden, F mlp, Q = heads x
                  head_dim, K = kv_heads x head_dim; Q, K and F divided by tp where the table
                  shards them):  carry = D (the residual between layers, always kept),
                  dots = 2D + Q + 2K + 2F (the projections' outputs), all = 4D + 2Q + 2K + 4F
                  (what autodiff keeps of one layer). remat none: L*R*T*all; full:
                  L*R*T*carry + R*T*all (one layer recomputed at a time); dots:
                  L*R*T*(carry + dots) + R*T*all. Dense attention adds H*T*(4 + c) bytes per
                  token to `all` (fp32 scores and probs) and H*T*4 to `dots`; flash kernels
                  (splash, cuDNN, blockwise XLA) keep O(1) per token.
  vision act.     the same over the vision blocks (multi-head: K = Q = D) and R*S slots, plus
                  the merger's 3D + D_text/4 per slot; window attention is dense over W keys.
  log-prob kernel 3 fp32 blocks of (chunk_tokens/B positions x R rows) x chunk_vocab, the LM
                  head gathered in c and its fp32 gradient (D x V/tp each), and the final
                  hidden states with their gradient (2 R*T*D*c).
  gathered        2 x the largest decoder layer or vision block in c, split by tp only
                  (FSDP gathers a layer's weights while the next one is fetched).
  inputs          R*S*(patch_dim + 3)*4 + R*T*10*4 (fp32 pixels, slot positions, ids, targets)
  micro grad      4P   the fp32 gradient of one micro-batch, live while it is added to the sums
  layer grad      4 x the largest layer / tp: its weight gradient before FSDP's reduce-scatter
                  shards it (fp32, the master weights' dtype)
  MLP backward    the gradients of the gate and up outputs of the layer being rebuilt, 2*N*F*c
                  (F / tp), the larger of the text stack's (N = R*T) and the vision stack's (R*S):
                  the two stacks' backward passes run one after the other
  apply           8P   the scaled gradients and AdamW updates of the optimizer step

peak = parameters + gradients + optimizer + reference + max(step terms, apply). It fits when
the peak is at most `plan.usable_hbm` of the chip's HBM (XLA keeps some for itself).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

from dart_jax.config.loader import ConfigError
from dart_jax.models.config import Qwen25VLConfig
from dart_jax.train.kernels import kernel_chunks
from dart_jax.capacity.chips import GIB, Chip, chip, parse_accelerator_type
from dart_jax.capacity.memory import F32, activations, attention_extra
from dart_jax.capacity.sizes import (Batch, Params, Screens, batch_of, factor, param_counts, screens_of,
                                 text_stack, vision_stack)

INPUT_ARRAYS_PER_TOKEN = 10  # ids, mask, 3 positions, image index, targets, loss mask, logp x2


@dataclasses.dataclass(frozen=True)
class Term:
    name: str
    bytes: float
    formula: str


@dataclasses.dataclass(frozen=True)
class Plan:
    lines: tuple[str, ...]  # what was assumed, one fact a line
    static: tuple[Term, ...]
    step: tuple[Term, ...]
    apply: Term
    chip: Chip
    usable_hbm: float
    warnings: tuple[str, ...]

    @property
    def peak(self) -> float:
        return sum(t.bytes for t in self.static) + max(sum(t.bytes for t in self.step), self.apply.bytes)

    @property
    def fits(self) -> bool:
        return self.peak <= self.usable_hbm * self.chip.hbm_bytes


def model_config(cfg, source: str):
    """(Qwen25VLConfig, the config.json it came from): the policy's, else plan.model_config."""
    hf = Path(cfg.policy.hf_dir) / "config.json" if cfg.policy.hf_dir else None
    if hf is not None and _is(hf.is_file, source, "policy.hf_dir"):
        path = hf
    elif cfg.plan.model_config:
        path = Path(cfg.plan.model_config)
        path = path / "config.json" if _is(path.is_dir, source, "plan.model_config") else path
    else:
        raise ConfigError(source, "plan.model_config", f"empty, and policy.hf_dir {cfg.policy.hf_dir!r} has no "
                          "config.json here: name a config.json (configs/models/*.config.json)")
    try:
        return Qwen25VLConfig.from_hf(json.loads(path.read_text())), str(path)
    except (OSError, ValueError) as e:
        raise ConfigError(source, "plan.model_config", f"cannot read {path}: {e}") from None


def _is(test, source: str, key: str) -> bool:
    """`test()` (Path.is_file, is_dir), a ConfigError on `key` where it raises: this user may
    not look there (another user's 0700 home), which is a config to fix, not a crash to retry."""
    try:
        return test()
    except OSError as e:
        raise ConfigError(source, key, f"cannot be read by uid {os.geteuid()}: {e.filename}: {e.strerror}") from None


def chip_of(cfg, source: str) -> tuple[Chip, int | None]:
    """The chip, and how many the TPU slice has (None when no accelerator type is set)."""
    try:
        slice_ = parse_accelerator_type(cfg.tpu.accelerator_type) if cfg.tpu.accelerator_type else None
    except ValueError as e:
        raise ConfigError(source, "tpu.accelerator_type", str(e)) from None
    name = cfg.plan.chip or (slice_[0] if slice_ else "")
    if not name:
        raise ConfigError(source, "plan.chip", "empty, and no tpu.accelerator_type to take the chip from")
    try:
        return chip(name), slice_[1] if slice_ else None
    except ValueError as e:
        raise ConfigError(source, "plan.chip", str(e)) from None


def static_terms(trainer, p: Params) -> list[Term]:
    share = f"P = {p.chip:,.0f} of {p.total:,} parameters on this chip"
    terms = [Term("parameters", F32 * p.chip, f"4 B x P, fp32 master weights; {share}"),
             Term("gradients", F32 * p.chip, "4 B x P, the fp32 accumulator of gradient sums"),
             Term("optimizer", 2 * F32 * p.chip, "8 B x P, AdamW mu and nu in fp32")]
    if trainer.mode == "rl" and trainer.loss.kl_coef > 0:
        terms.append(Term("reference", F32 * p.chip, f"4 B x P, the frozen policy of the k3 KL "
                                                     f"(kl_coef {trainer.loss.kl_coef:g})"))
    return terms


def text_term(model, trainer, b: Batch, mesh, c: int, dense: bool) -> Term:
    t = model.text
    heads = t.num_attention_heads / factor(("act_heads",), (t.num_attention_heads,), mesh)
    att = [attention_extra(heads, b.seq_len, c, dense)] * t.num_hidden_layers
    size, formula = activations(text_stack(t, mesh), trainer.remat, b.rows_chip * b.seq_len, c, att)
    return Term("text act.", size, f"N = R*T tokens: {formula}")


def vision_term(model, trainer, b: Batch, mesh, c: int, dense: bool) -> Term:
    v = model.vision
    heads = v.num_heads / factor(("act_heads",), (v.num_heads,), mesh)
    full = set(v.fullatt_block_indexes)
    att = [attention_extra(heads, b.slots, c, dense) if i in full else
           attention_extra(heads, v.window_patches, c, True) for i in range(v.depth)]
    n = b.rows_chip * b.slots
    size, formula = activations(vision_stack(v, mesh), trainer.remat, n, c, att)
    merger = n * (3 * v.hidden_size + model.text.hidden_size / 4) * c
    return Term("vision act.", size + merger,
                f"N = R*S slots: {formula}; merger N*(3*{v.hidden_size} + {model.text.hidden_size}/4)*c")


def kernel_term(model, trainer, b: Batch, p: Params, c: int, backend: str) -> Term:
    chunk_tokens, chunk_vocab = kernel_chunks(trainer.kernel, backend, b.rows * b.seq_len, model.text.vocab_size)
    t = model.text
    positions = min(max(1, chunk_tokens // b.rows), b.seq_len)
    vocab = min(chunk_vocab, t.vocab_size)
    blocks = 3 * positions * b.rows_chip * vocab * F32
    hidden = 2 * b.rows_chip * b.seq_len * t.hidden_size * c
    return Term("log-prob kernel", blocks + p.head * (c + F32) + hidden,
                f"3 blocks {positions}x{b.rows_chip:g} rows x {vocab} x 4 B + LM head "
                f"{p.head:,.0f} x ({c} + 4 B) + h, dh 2*R*T*{t.hidden_size}*{c}")


def step_terms(model, trainer, b: Batch, p: Params, mesh, c: int, dense: bool, backend: str) -> list[Term]:
    v = model.vision
    inputs = b.rows_chip * (b.slots * (v.patch_dim + 3) + b.seq_len * INPUT_ARRAYS_PER_TOKEN) * F32
    return [text_term(model, trainer, b, mesh, c, dense), vision_term(model, trainer, b, mesh, c, dense),
            kernel_term(model, trainer, b, p, c, backend),
            Term("gathered", 2 * p.layer * c, f"2 x {p.layer:,.0f} (largest layer / tp) x {c} B"),
            Term("inputs", inputs, f"R*(S*({v.patch_dim}+3) + T*{INPUT_ARRAYS_PER_TOKEN})*4 B"),
            Term("micro grad", F32 * p.chip, "4 B x P, one micro-batch's fp32 gradient beside the sums"),
            Term("layer grad", F32 * p.layer, f"4 B x {p.layer:,.0f} (largest layer / tp), before its reduce-scatter"),
            mlp_backward_term(model, b, mesh, c)]


def mlp_backward_term(model, b: Batch, mesh, c: int) -> Term:
    text = 2 * b.rows_chip * b.seq_len * text_stack(model.text, mesh).mlp * c
    vision = 2 * b.rows_chip * b.slots * vision_stack(model.vision, mesh).mlp * c
    return Term("MLP backward", max(text, vision),
                f"max(text 2*R*T*F*c = {text:,.0f}, vision 2*R*S*F*c = {vision:,.0f}) B, F / tp")


DTYPE_BYTES = {"bfloat16": 2, "float32": 4}


def mesh_of(trainer) -> dict[str, int]:
    return {"data": trainer.mesh.data, "fsdp": trainer.mesh.fsdp, "tp": trainer.mesh.tp}


def _describe(cfg, model, model_src: str, p: Params, b: Batch, screens: Screens, chip_: Chip, hosts: int,
              attention: str) -> tuple[str, ...]:
    tr = cfg.trainer
    chips = math.prod(mesh_of(tr).values())
    return (f"model     {model_src}: {p.total:,} parameters; text {model.text.num_hidden_layers} x "
            f"{model.text.hidden_size}, vision {model.vision.depth} x {model.vision.hidden_size}, "
            f"vocab {model.text.vocab_size:,}",
            f"chips     {chips} x {chip_.label} ({hosts} hosts of {chip_.chips_per_host}), {chip_.hbm_gib:g} GiB "
            f"HBM each, {cfg.plan.usable_hbm:.0%} usable",
            f"mesh      data={tr.mesh.data} fsdp={tr.mesh.fsdp} tp={tr.mesh.tp}; compute {tr.compute_dtype}; "
            f"remat {tr.remat}; attention {attention}; mode {tr.mode}",
            f"batch     R = {b.rows_chip:g} rows per chip of {tr.buckets.rows} per host x {hosts} hosts = "
            f"{b.rows} per micro-batch, x{tr.buckets.accum_steps} accumulated; T = {b.seq_len:,} tokens, "
            f"S = {b.slots:,} vision slots",
            f"screens   {screens.count} x {cfg.plan.screen_width}x{cfg.plan.screen_height} -> "
            f"{screens.resized[1]}x{screens.resized[0]}: {screens.patches:,} patches, {screens.tokens:,} "
            f"merged tokens, {screens.slots:,} slots each")


def build(cfg, source: str) -> Plan:
    """The per-chip estimate of `cfg`'s trainer (`source` names the config in errors)."""
    model, model_src = model_config(cfg, source)
    chip_, slice_chips = chip_of(cfg, source)
    tr, mesh = cfg.trainer, mesh_of(cfg.trainer)
    chips = math.prod(mesh.values())
    hosts = math.ceil(chips / chip_.chips_per_host)
    try:
        screens = screens_of(model, cfg.plan, tr)
    except ValueError as e:
        raise ConfigError(source, "trainer.buckets", str(e)) from None
    b, p, c = batch_of(tr, hosts, mesh), param_counts(model, mesh), DTYPE_BYTES[tr.compute_dtype]
    # a trainer option the attention backends may add; without it the model's default ("auto")
    # runs a flash kernel (splash on TPU, cuDNN on GPU); only "dense" keeps [T, T] scores
    attention = getattr(tr, "attention", "auto")
    try:
        step = step_terms(model, tr, b, p, mesh, c, attention == "dense", "tpu" if chip_.is_tpu else "gpu")
    except ValueError as e:  # a remat policy without a formula
        raise ConfigError(source, "trainer.remat", str(e)) from None
    apply = Term("apply", 2 * F32 * p.chip, "8 B x P, scaled gradients and AdamW updates (optimizer step)")
    return Plan(_describe(cfg, model, model_src, p, b, screens, chip_, hosts, attention),
                tuple(static_terms(tr, p)), tuple(step), apply, chip_, cfg.plan.usable_hbm,
                tuple(_warnings(screens, b, chips, slice_chips)))


def _warnings(screens: Screens, b: Batch, chips: int, slice_chips: int | None) -> list[str]:
    out = []
    if slice_chips is not None and slice_chips != chips:
        out.append(f"the mesh uses {chips} chips but the TPU slice has {slice_chips}")
    if screens.count * screens.slots > b.slots:
        out.append(f"S = {b.slots:,} slots cannot hold {screens.count} screenshots ({screens.count * screens.slots:,}): "
                   "such steps are dropped")
    if screens.count * screens.tokens >= b.seq_len:
        out.append(f"T = {b.seq_len:,} tokens cannot hold {screens.count} screenshots' {screens.count * screens.tokens:,} "
                   "image tokens and the text")
    return out


def render(plan: Plan, source: str) -> str:
    usable = plan.usable_hbm * plan.chip.hbm_bytes
    step = sum(t.bytes for t in plan.step)
    out = [f"dart-jax plan: {source}", *plan.lines, "", f"{'per chip':<16}{'GiB':>9}  formula"]
    out += [f"{t.name:<16}{t.bytes / GIB:>9.3f}  {t.formula}" for t in (*plan.static, *plan.step, plan.apply)]
    out.append(f"{'peak':<16}{plan.peak / GIB:>9.3f}  static + max(step {step / GIB:.3f}, apply "
               f"{plan.apply.bytes / GIB:.3f}); {usable / GIB:.2f} GiB usable of {plan.chip.hbm_gib:g}")
    out += [f"WARNING: {w}" for w in plan.warnings]
    if not plan.fits:
        out.append(f"WARNING: does not fit: peak {plan.peak / GIB:.2f} GiB > {usable / GIB:.2f} GiB usable "
                   f"({plan.usable_hbm:.0%} of {plan.chip.label}'s {plan.chip.hbm_gib:g} GiB)")
    return "\n".join(out)


def main(cfg, source: str, strict: bool = False) -> int:
    """Print the plan; with `strict`, exit 1 when it warns (does not fit, or drops steps)."""
    plan = build(cfg, source)
    print(render(plan, source))
    return 1 if strict and (plan.warnings or not plan.fits) else 0
