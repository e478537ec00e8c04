"""The positional-encoding trade-offs, with every number computed now from the library.

Three questions per registered scheme (``tokenpos.tables.registry``: the memory and extrapolation tables list
every one; a scheme added there without a finding here fails tests/analysis/test_report_schemes.py), at
context L and width D:

1. memory: what the scheme stores (tokenpos.analysis.memory);
2. extrapolation: what happens at positions L..2L-1, shown with the real layers and tables;
3. variance across positions: how much an additive encoding moves from position to position, per
   dimension, compared with the token embeddings it is added to.

Shapes: L max_seq_len, D d_model, H heads, Dh head dim, F = Dh / 2.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tokenpos.analysis.memory import MIB, POSITIONAL_KINDS, position_alternatives

ALIBI_NEGLIGIBLE = 10.0  # a bias below -10 scales an attention weight by < e^-10 = 4.5e-5


@dataclass(frozen=True)
class Extrapolation:
    scheme: str
    beyond_max: str       # "refused", "computed", "relative", ...
    finding: str          # one sentence with the numbers


@dataclass(frozen=True)
class VarianceRow:
    """Per-dimension variance across the L positions of one (L, D) table."""

    name: str
    mean: float
    min: float
    max: float
    frac_low: float       # share of dimensions whose variance is < 0.01 (barely move over L positions)


@dataclass
class Tradeoffs:
    max_seq_len: int
    d_model: int
    num_heads: int
    head_dim: int
    memory: list[tuple[str, int, float, str]] = field(default_factory=list)  # scheme, params, fp32 MiB, note
    extrapolation: list[Extrapolation] = field(default_factory=list)
    variance: list[VarianceRow] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)


def _variance(name: str, table: np.ndarray) -> VarianceRow:
    var = table.var(axis=0)                                                     # (D,)
    return VarianceRow(name, float(var.mean()), float(var.min()), float(var.max()), float((var < 0.01).mean()))


def _learned_beyond(L: int, D: int) -> str:
    """The error the learned layer raises for sequence length 2L (the real layer when importable)."""
    positions = np.arange(2 * L)
    try:
        try:
            from tokenpos.numpy.learned import LearnedPositionalEmbedding
        except ImportError:  # the backend is optional here: the check every layer calls
            from tokenpos.tables.checks.validation import check_seq_len_or_positions

            check_seq_len_or_positions(positions, L)
        else:
            LearnedPositionalEmbedding(L, D, seed=0)(positions)
    except ValueError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error (unexpected)"


def _extrapolation(L: int, D: int, H: int, Dh: int, rng: np.random.Generator) -> list[Extrapolation]:
    from tokenpos.tables import sinusoidal_table
    from tokenpos.tables.formulas.alibi import alibi_slopes
    from tokenpos.tables.formulas.rope import rope_cos_sin, rope_inv_freq, rope_rotate
    from tokenpos.tables.formulas.t5 import t5_relative_bucket

    out = [Extrapolation("learned", "refused", f"Asking for {2 * L} positions raises: {_learned_beyond(L, D)}. "
                         f"Longer contexts need a bigger table and training on long sequences.")]
    # sinusoidal: PE(p) . PE(p + k) must not depend on p, also for p beyond L.
    pe = sinusoidal_table(3 * L, D)                                                 # (3L, D)
    gram = pe @ pe.T                                                                # (3L, 3L)
    p, k = np.arange(2 * L)[:, None], np.arange(1, L)[None, :]
    dots = gram[p, p + k]                                                           # (2L, L-1): PE(p).PE(p+k)
    drift = float(np.abs(dots[L:] - dots[:1]).max())                                # p >= L against p = 0
    out.append(Extrapolation("sinusoidal", "computed",
                             f"Positions {L}..{2 * L - 1} are computed on demand (no table needed), with values in "
                             f"[-1, 1]. PE(p).PE(p+k) depends on k only: for p >= L it differs from p = 0's by at "
                             f"most {drift:.1e}, so relative offsets look as in training. The absolute vectors are "
                             f"new to the model, though, and sinusoidal models are known to degrade past L "
                             f"(Press et al. 2022, the ALiBi paper)."))
    # rope: the q.k score depends on m - n only; low-frequency pairs never complete a turn within L.
    inv_freq, att = rope_inv_freq(Dh)                                               # (F,)
    q, kk = rng.standard_normal((2, Dh))
    m, n = np.array([5, 5 + L]), np.array([2, 2 + L])
    cq, sq = rope_cos_sin(m, inv_freq, attention_factor=att)                        # (2, Dh)
    ck, sk = rope_cos_sin(n, inv_freq, attention_factor=att)
    scores = np.sum(rope_rotate(np.stack([q, q]), cq, sq) * rope_rotate(np.stack([kk, kk]), ck, sk), axis=-1)
    slow = int((2 * np.pi / inv_freq > L).sum())
    out.append(Extrapolation("rope", "relative",
                             f"The q.k score depends on m - n only: at (5, 2) and ({5 + L}, {2 + L}) it is "
                             f"{scores[0]:.6f} and {scores[1]:.6f}. But {slow} of {inv_freq.shape[0]} frequency pairs "
                             f"(head_dim {Dh}) have a wavelength above L = {L}: at distances beyond L their angles "
                             f"were never seen in training, which is why RoPE models need scaling "
                             f"(see the rope plot)."))
    slopes = alibi_slopes(H)                                                        # (H,)
    window = ALIBI_NEGLIGIBLE / slopes
    out.append(Extrapolation("alibi", "relative",
                             f"The bias -m_h * distance is defined for any distance and only grows more negative. "
                             f"A key further than 10 / m_h is damped by more than e^-10: from {window[0]:,.0f} tokens "
                             f"(head 0, m = {slopes[0]:.3g}) to {window[-1]:,.0f} tokens (head {H - 1}), so each head "
                             f"acts as a soft local window and longer inputs see familiar bias values."))
    near = np.unique(t5_relative_bucket(-np.arange(L)))
    far = np.setdiff1d(np.unique(t5_relative_bucket(-np.arange(L, 2 * L))), near)
    out.append(Extrapolation("t5", "relative, clipped",
                             f"Distances 0..{L - 1} use {near.size} buckets; distances {L}..{2 * L - 1} add "
                             f"{far.size} new ones: beyond max_distance 128 every key shares the last bucket's "
                             f"learned bias, so longer inputs reuse trained values but cannot tell far keys apart."))
    out.append(Extrapolation("none", "n/a", "No positional signal to extrapolate; causal attention alone gives the "
                             "model an implicit sense of order (NoPE), with no parameters and no length limit."))
    out += _extrapolation_more(L, D, H, Dh, slow)
    order = {name: i for i, name in enumerate(POSITIONAL_KINDS)}     # every registered scheme, memory's order
    return sorted(out, key=lambda e: order.get(e.scheme, len(order)))


def _extrapolation_more(L: int, D: int, H: int, Dh: int, slow: int) -> list[Extrapolation]:
    """The registered schemes beyond seed 004's six: fire, kerple, xpos, mrope, rope2d, sincos2d (``slow``: RoPE's
    pairs with a wavelength above L). FIRE and KERPLE at their reference initialisation drawn from
    ``default_rng(0)`` (as ``tokenpos plot fire|kerple``), a generator of their own: the other rows' numbers
    do not depend on them."""
    from tokenpos.tables.formulas.fire import fire_bias, fire_init
    from tokenpos.tables.formulas.kerple import kerple_bias, kerple_init
    from tokenpos.tables.formulas.mrope import mrope_axis_map, mrope_cos_sin
    from tokenpos.tables.formulas.rope import rope_cos_sin, rope_inv_freq
    from tokenpos.tables.formulas.rope2d import rope2d_inv_freq, sincos_2d_table
    from tokenpos.tables.formulas.xpos import xpos_scale
    from tokenpos.tables.registry import mrope_section_for

    out = []
    rng = np.random.default_rng(0)
    params = fire_init(H, 32, rng)
    at_l, _ = fire_bias(params, 1, L, init_L=float(L))                     # (H, 1, L): query at L - 1
    at_2l, cache = fire_bias(params, 1, 2 * L, init_L=float(L))            # (H, 1, 2L): query at 2L - 1
    same = np.abs(at_2l[:, 0, L:] - at_l[:, 0, :]).max()                   # distances 0..L-1 from both queries
    out.append(Extrapolation("fire", "relative, interpolated",
                             f"The MLP reads log-distance / log(max(query position, L)): for a query at {2 * L - 1} "
                             f"every distance still maps into [0, {cache.x.max():.3f}], the range trained on, so no "
                             f"input is new; but the same distance maps lower than at L, so at initialisation the "
                             f"bias of distances 0..{L - 1} moves by up to {same:.3g} between queries at {L - 1} and "
                             f"{2 * L - 1} (FIRE's progressive interpolation)."))
    r1, r2 = kerple_init(H, rng)
    d = np.array([[float(L), 2.0 * L]])
    kb = kerple_bias(r1, r2, d)[:, 0]                                      # (H, 2)
    out.append(Extrapolation("kerple", "relative",
                             f"-r1 log(1 + r2 d) is defined for every distance and only falls: at initialisation "
                             f"doubling the distance from {L} to {2 * L} deepens the bias by at most "
                             f"{np.abs(kb[:, 1] - kb[:, 0]).max():.3f} (at most r1 log 2 per head), a slower "
                             f"logarithmic decay than ALiBi's linear one, so far keys stay visible."))
    scale = xpos_scale(np.array([L, 2 * L]), Dh)                           # (2, F): q at d, k at 0 (scale 1)
    out.append(Extrapolation("xpos", "relative, decaying",
                             f"RoPE's rotation (the same unseen angles past L) times zeta^(distance / 512) per pair: "
                             f"the fastest-decaying pair keeps {scale[0].min():.3g} of its score at distance {L} and "
                             f"{scale[1].min():.3g} at {2 * L}, so far keys fade smoothly instead of aliasing."))
    inv, att = rope_inv_freq(Dh)
    ids = np.arange(2 * L)
    mc, _ = mrope_cos_sin(np.stack([ids] * 3), inv, mrope_axis_map(mrope_section_for(Dh), inv.shape[0]),
                          attention_factor=att)
    rc, _ = rope_cos_sin(ids, inv, attention_factor=att)
    out.append(Extrapolation("mrope", "relative (per axis)",
                             f"Text tokens carry the same id on the t, h and w axes, and then M-RoPE is RoPE: for "
                             f"positions 0..{2 * L - 1} its cos table differs from RoPE's by "
                             f"{np.abs(mc - rc).max():.1e}, so past L it meets the same {slow} unseen slow pairs; an "
                             f"image larger than in training adds unseen h and w offsets as well."))
    s = max(1, int(np.sqrt(L)))
    inv2, _ = rope2d_inv_freq(Dh)
    long2 = int((2 * np.pi / inv2 > s).sum())
    out.append(Extrapolation("rope2d", "relative (per axis)",
                             f"Rows and columns rotate separately, so a patch's score depends on its (row, column) "
                             f"offset only; a grid larger than the {s} x {s} one trained on brings offsets beyond "
                             f"{s - 1} per axis, where {long2} of its {inv2.shape[0]} frequencies (half per axis, "
                             f"head_dim {Dh}) have a wavelength above {s}: angles never seen in training."))
    small, large = sincos_2d_table(s, s, D), sincos_2d_table(2 * s, s, D)  # (s*s, D), (2s*s, D)
    out.append(Extrapolation("sincos2d", "computed",
                             f"The 2-D table is computed for any grid: a {2 * s} x {s} grid's first {s} rows equal "
                             f"the {s} x {s} grid's to {np.abs(large[: s * s] - small).max():.1e}, and the new rows "
                             f"are absolute vectors the model never saw, as with the 1-D sinusoidal table."))
    return out


def positional_tradeoffs(*, max_seq_len: int = 512, d_model: int = 256, num_heads: int = 8, head_dim: int = 64,
                         seed: int = 0, progress: Callable[[str, int, int], None] | None = None) -> Tradeoffs:
    """Compute the trade-off tables (seed 004 used L = 512, D = 256)."""
    from tokenpos.tables import init_weight, sinusoidal_table

    step = "trade-off analysis"
    tell = progress or (lambda s, d, t: None)
    L, D, H = max_seq_len, d_model, num_heads
    rng = np.random.default_rng(seed)
    out = Tradeoffs(L, D, H, head_dim)
    tell(step, 0, 3)
    for t in position_alternatives(L, D, H):
        out.memory.append((t.name, t.params, t.nbytes("fp32") / MIB, t.note))
    tell(step, 1, 3)
    out.extrapolation = _extrapolation(L, D, H, head_dim, rng)
    tell(step, 2, 3)
    sin = sinusoidal_table(L, D)                                                    # (L, D)
    learned = init_weight((L, D), "normal", std=0.02, rng=rng)                      # (L, D)
    xavier = init_weight((L, D), "xavier_uniform", rng=rng)
    token = init_weight((L, D), "normal", std=0.02, rng=rng)                        # L sampled token rows
    out.variance = [
        _variance("sinusoidal", sin),
        _variance("learned, init N(0, 0.02) (GPT-2, BERT)", learned),
        _variance("learned, init xavier_uniform", xavier),
        _variance("token embedding rows, N(0, 0.02)", token),
        _variance(f"token embedding rows x sqrt({D}) (scale=True)", token * np.sqrt(D)),
    ]
    side = max(1, int(np.sqrt(L)))                                                  # the largest square grid
    if D % 4 == 0:
        from tokenpos.tables.formulas.rope2d import sincos_2d_table

        out.variance.append(_variance(f"sincos2d, {side} x {side} patch grid", sincos_2d_table(side, side, D)))
    sv, learned_v, token_v, scaled_v = out.variance[0], out.variance[1], out.variance[3], out.variance[4]
    out.summary = [
        f"Memory: a learned table for L = {L}, D = {D} holds {L * D:,} parameters ({L * D * 4 / MIB:.2f} MiB in fp32, "
        f"{L * D * 16 / MIB:.2f} MiB while training with Adam); sinusoidal, RoPE and ALiBi hold none, T5 only "
        f"{32 * H:,} (32 buckets x {H} heads).",
        "Extrapolation: only the learned table refuses positions >= L. Sinusoidal computes them, but as absolute "
        "vectors the model never saw. The relative schemes (RoPE, ALiBi, T5) depend on distances only, so nearby "
        "tokens in a long input look exactly as in training; distances beyond L are still new to RoPE (unseen "
        "angles), damped by ALiBi and clipped to one bucket by T5.",
        f"Variance across positions: sinusoidal dimensions vary by {sv.mean:.3f} on average (from {sv.min:.2g} "
        f"to {sv.max:.3f}; {100 * sv.frac_low:.0f}% of them barely move over {L} positions: the low frequencies), "
        f"{sv.mean / token_v.mean:,.0f}x the variance of N(0, 0.02) token rows. A freshly initialised learned table "
        f"varies by only {learned_v.mean:.2g}, like the tokens: it carries no order until trained. Scaling the "
        f"tokens by sqrt(D) (variance {scaled_v.mean:.3f}) keeps the sinusoidal signal from drowning them.",
    ]
    tell(step, 3, 3)
    return out
