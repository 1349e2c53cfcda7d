"""Activation memory of a transformer stack under a remat policy (the formulas of capacity/plan.py).

Counts are per chip. Element counts per token and layer, with Q, K and F already divided by
the tensor-parallel split:

    carry = D                      the residual stream between layers
    dots  = 2D + Q + 2K + 2F       q, k, v, o, gate, up and down projection outputs
    all   = 4D + 2Q + 2K + 4F      x, norm1, q', k', v, attention out, x1, norm2, gate, up,
                                   silu(gate), their product

Attention adds bytes per token and layer: dense scores (H x keys, fp32) and probs (compute
dtype) to `all`, the scores alone to `dots` (checkpoint_dots saves dot outputs); a flash
kernel adds nothing of size keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

F32 = 4


@dataclasses.dataclass(frozen=True)
class Stack:
    """One stack of identical layers, as the formulas see it (Q, K, F split by tp)."""
    layers: int
    hidden: float  # D
    q: float  # heads x head_dim
    kv: float  # kv heads x head_dim
    mlp: float  # F

    @property
    def carry(self) -> float:
        return self.hidden

    @property
    def dots(self) -> float:
        return 2 * self.hidden + self.q + 2 * self.kv + 2 * self.mlp

    @property
    def all(self) -> float:
        return 4 * self.hidden + 2 * self.q + 2 * self.kv + 4 * self.mlp


def attention_extra(heads: float, keys: int, c: int, dense: bool) -> tuple[float, float]:
    """(bytes added to `all`, bytes added to `dots`) per token of one attention layer."""
    if not dense:
        return 0.0, 0.0
    return heads * keys * (F32 + c), heads * keys * F32


# remat policy -> (formula, elements kept per token): every layer's carry or more, plus the one
# layer whose `all` is rebuilt at a time in the backward
POLICIES = {
    "none": ("L*N*all*c", lambda s: s.layers * s.all),
    "full": ("L*N*carry*c + N*all*c", lambda s: s.layers * s.carry + s.all),
    "dots": ("L*N*(carry+dots)*c + N*all*c", lambda s: s.layers * (s.carry + s.dots) + s.all),
}


def _attention_bytes(remat: str, attention: Sequence[tuple[float, float]]) -> float:
    """Dense attention bytes per token kept: every layer's (none), the rebuilt layer's (full), or
    every layer's saved scores and the rebuilt layer's (dots)."""
    live = max(a for a, _ in attention)
    if remat == "none":
        return sum(a for a, _ in attention)
    return live + (sum(d for _, d in attention) if remat == "dots" else 0.0)


def activations(s: Stack, remat: str, tokens: float, c: int,
                attention: Sequence[tuple[float, float]]) -> tuple[float, str]:
    """(bytes, formula) kept for the backward over N = `tokens` tokens; attention[i] is layer
    i's attention_extra."""
    if remat not in POLICIES:
        raise ValueError(f"remat policy {remat!r} has no memory formula (known: {', '.join(POLICIES)})")
    if len(attention) != s.layers:
        raise ValueError(f"{len(attention)} attention entries for {s.layers} layers")
    formula, elements = POLICIES[remat]
    attn = _attention_bytes(remat, attention)
    dense = f" + N*{attn:,.0f} B of dense attention" if attn else ""
    values = f"L={s.layers} N={tokens:,.0f} carry={s.carry:,.0f} dots={s.dots:,.0f} all={s.all:,.0f} c={c}"
    return tokens * (elements(s) * c + attn), f"{formula}{dense}; {values}"
