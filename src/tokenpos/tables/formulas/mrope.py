"""M-RoPE (multimodal RoPE, Qwen2-VL / Qwen2.5-VL / Qwen3-VL): three position axes share the frequencies.

Shapes: B batch, L length, F = Dh / 2 frequencies, R = 2F rotated features, ``...`` any leading.
Positions have shape (3, ..., L): temporal, height and width ids (text tokens carry the same id on
all three axes, so M-RoPE on text is plain RoPE).

Each frequency j takes its position from one axis, ``axis_of_freq[j]``; then the rotation is the usual
half-layout RoPE (pair j = features (j, j + F)), so the backward is the rotation by -angle:

- ``sections`` (Qwen2-VL, Qwen2.5-VL): ``mrope_section = [t, h, w]`` with t + h + w = F; frequencies
  [0, t) read T, [t, t + h) read H, the rest read W (HF ``Qwen2VLRotaryEmbedding.recomposition_frequencies``).
- ``interleaved`` (Qwen3-VL): j % 3 == 1 and j < 3h reads H, j % 3 == 2 and j < 3w reads W, all others
  read T (HF ``Qwen3VLTextRotaryEmbedding.recomposition_frequencies``).

A kernel that hard-codes one of these pairings on a model of the other gives garbage silently; here
the map is explicit and tested against both HF modules.

:class:`MRopeSettings` is what every ``MRotaryEmbedding`` constructor builds (both backends): the checked
settings and the frequencies, computed once. The layers' input checks are in ``tables.checks.rotary_layers``;
reading a Qwen-VL config is ``tables.hf.models.mrope_kwargs_from_hf_config``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.packing import check_cu_seqlens
from tokenpos.tables.checks.rope import check_qk_layout
from tokenpos.tables.checks.validation import check_choice, check_int, check_positions
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.rope import expand_to_layout, rope_inv_freq
from tokenpos.tables.formulas.rope_scaling import LENGTH_DEPENDENT_TYPES, normalize_rope_scaling

MROPE_LAYOUTS = ("sections", "interleaved")
# length-dependent scalings keep per-call state; no M-RoPE model uses them
MROPE_REFUSED_TYPES = LENGTH_DEPENDENT_TYPES


def mrope_axis_map(mrope_section: Any, num_freqs: int, *, layout: str = "sections") -> np.ndarray:
    """Which position axis (0 = T, 1 = H, 2 = W) each frequency reads: shape (F,), int64.

    Raises:
        ConfigError: a section list that is not 3 non-negative ints, or that does not fit F
            (``sections``: sum == F; ``interleaved``: 3 * h <= F and 3 * w <= F).
    """
    check_choice("mrope layout", layout, MROPE_LAYOUTS)
    sec = list(mrope_section) if isinstance(mrope_section, (list, tuple, np.ndarray)) else None
    if sec is None or len(sec) != 3 or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                                               and s >= 0 for s in sec):
        raise ConfigError(f"mrope_section must be 3 non-negative ints [t, h, w], got {mrope_section!r}")
    t, h, w = (int(s) for s in sec)
    if layout == "sections":
        if t + h + w != num_freqs:
            raise ConfigError(f"mrope_section {[t, h, w]} sums to {t + h + w}; expected head_dim / 2 = {num_freqs}")
        return np.repeat(np.arange(3, dtype=np.int64), [t, h, w])
    if 3 * h > num_freqs or 3 * w > num_freqs:
        raise ConfigError(f"interleaved mrope_section {[t, h, w]} needs 3 * h and 3 * w <= head_dim / 2 = "
                          f"{num_freqs}")
    axis = np.zeros(num_freqs, dtype=np.int64)
    axis[1:3 * h:3] = 1
    axis[2:3 * w:3] = 2
    return axis


def mrope_positions(positions: Any) -> np.ndarray:
    """Positions as (3, B, L) int64 (or (3, L) from text positions (L,)).

    A 3-D array must be (3, B, L) (HF's M-RoPE ``position_ids``); text positions (L,) or (B, L) are
    put on all three axes, as HF's ``position_ids.expand(3, -1, -1)``.
    """
    pos = check_positions(positions)
    if pos.ndim == 3:
        if pos.shape[0] != 3:
            raise ConfigError(f"M-RoPE positions must have shape (3, B, L) (temporal, height, width), "
                              f"got {tuple(pos.shape)}")
        return pos
    if pos.ndim not in (1, 2):
        raise ConfigError(f"M-RoPE positions must have shape (3, B, L), (B, L) or (L,), got {tuple(pos.shape)}")
    return np.broadcast_to(pos, (3, *pos.shape))


def mrope_angles(positions: Any, inv_freq: np.ndarray, axis_map: np.ndarray) -> np.ndarray:
    """(3, ..., L) positions -> angles (..., L, F) in float64: ``positions[axis_map[j]] * inv_freq[j]``."""
    pos = np.asarray(positions).astype(np.float64)                      # (3, ..., L)
    picked = np.moveaxis(pos[np.asarray(axis_map)], 0, -1)              # (..., L, F)
    return picked * np.asarray(inv_freq, dtype=np.float64)


def mrope_cos_sin(positions: Any, inv_freq: np.ndarray, axis_map: np.ndarray, *,
                  attention_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (..., L, R) float64 in the half layout, times ``attention_factor``."""
    ang = mrope_angles(positions, inv_freq, axis_map)
    return (expand_to_layout(np.cos(ang)) * attention_factor, expand_to_layout(np.sin(ang)) * attention_factor)


def _grid(grid: Any, name: str) -> np.ndarray | None:
    if grid is None:
        return None
    g = np.asarray(grid)
    if g.ndim != 2 or g.shape[1] != 3 or not np.issubdtype(g.dtype, np.integer) or (g.size and g.min() < 1):
        raise ConfigError(f"{name} must be positive ints of shape (N, 3) (t, h, w), got {g.dtype} {g.shape}")
    return g.astype(np.int64)


def _video_intervals(tokens_per_second: float | None, second_per_grid_ts: Any, videos: np.ndarray | None,
                     split: bool) -> np.ndarray | None:
    """(num_videos,) float32 steps between temporal ids (Qwen2.5-VL), or None (no temporal scaling)."""
    if tokens_per_second is None:
        if second_per_grid_ts is not None:
            raise ConfigError("second_per_grid_ts needs tokens_per_second (Qwen2.5-VL's vision_config); got None")
        return None
    if split:
        raise ConfigError("tokens_per_second scales whole-video grids (Qwen2.5-VL); it cannot be combined with "
                          "split_video_frames=True (Qwen3-VL)")
    n = 0 if videos is None else videos.shape[0]
    secs = np.ones(n, dtype=np.float32) if second_per_grid_ts is None else np.asarray(second_per_grid_ts,
                                                                                       dtype=np.float32)
    if secs.ndim != 1 or secs.shape[0] < n or not np.isfinite(secs).all() or (secs < 0).any():
        raise ConfigError(f"second_per_grid_ts must be (num_videos,) = ({n},) finite values >= 0, got "
                          f"shape {secs.shape}")
    return (np.float32(tokens_per_second) * secs).astype(np.float32)


def mrope_position_ids(token_types: Any, image_grid_thw: Any = None, video_grid_thw: Any = None, *,
                       spatial_merge_size: int = 1, attention_mask: Any = None,
                       split_video_frames: bool = False, tokens_per_second: float | None = None,
                       second_per_grid_ts: Any = None, cu_seqlens: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """The (3, B, L) M-RoPE position ids of text + image/video inputs, as HF's ``get_rope_index``.

    Each run of text tokens counts up from the current position on all three axes; each run of
    vision tokens is one grid: T ids ``start + arange(t)``, H ids ``start + arange(h / m)``, W ids
    ``start + arange(w / m)`` (m = spatial_merge_size) over the (t, h/m, w/m) grid in row-major order;
    the current position then moves on by ``max(h, w) / m``.

    A packed row (``cu_seqlens``): several samples side by side in one row of T tokens, each counted from 0
    as if it were a row of its own (what HF leaves to the caller for packed Qwen-VL training), so the ids
    equal ``get_rope_index`` of the samples padded in a batch, without the padding. The grids are taken in
    the order their runs occur along the row, as in a batch; a vision run never spans two samples.

    Args:
        token_types: (B, L) ints: 0 text, 1 image, 2 video (HF ``mm_token_type_ids``); (1, T) or (T,)
            with ``cu_seqlens``.
        image_grid_thw, video_grid_thw: (N, 3) grids (t, h, w) in patches, in the order they occur.
        spatial_merge_size: m, patches merged per token along h and w.
        attention_mask: (B, L) 0/1; masked tokens are skipped and keep position 0. Not with ``cu_seqlens``
            (a packed row has no padding).
        split_video_frames: Qwen3-VL: each video frame is its own grid with t = 1.
        tokens_per_second: Qwen2.5-VL (``vision_config.tokens_per_second``): the T ids of the v-th video
            are ``start + trunc(arange(t) * tokens_per_second * second_per_grid_ts[v])``, the product in
            float32 as HF computes it. None (Qwen2-VL): no temporal scaling.
        second_per_grid_ts: (num_videos,) seconds per temporal grid step; None: 1 for every video.
        cu_seqlens: (S + 1,) int32 / int64 sample boundaries of a packed row: 0, the cumulative lengths, T.

    Returns:
        ``(positions (3, B, L) int64, deltas (B, 1) int64)``, deltas = max position + 1 - tokens; packed:
        ``(positions (3, 1, T), deltas (S, 1))``, one delta per sample.

    Raises:
        ConfigError: a vision run whose length is not its grid's token count, too few grids, bad shapes,
            fewer ``second_per_grid_ts`` than videos, temporal scaling with ``split_video_frames``,
            ``attention_mask`` with ``cu_seqlens``; ``cu_seqlens`` as ``positions_from_cu_seqlens`` checks it.
    """
    types = np.asarray(token_types)
    if cu_seqlens is not None and types.ndim == 1:
        types = types[None]
    if types.ndim != 2 or not np.issubdtype(types.dtype, np.integer) or not np.isin(types, (0, 1, 2)).all():
        raise ConfigError(f"token_types must be (B, L) ints in {{0, 1, 2}}, got {types.dtype} {types.shape}")
    m = check_int("spatial_merge_size", spatial_merge_size, minimum=1)   # 0 divided by zero, 2.5 was cut to 2
    grids = {1: _grid(image_grid_thw, "image_grid_thw"), 2: _grid(video_grid_thw, "video_grid_thw")}
    if split_video_frames and grids[2] is not None:
        frames = np.repeat(grids[2], grids[2][:, 0], axis=0)
        frames[:, 0] = 1
        grids[2] = frames
    intervals = _video_intervals(tokens_per_second, second_per_grid_ts, grids[2], split_video_frames)
    used = {1: 0, 2: 0}

    def ids_of(row: np.ndarray, where: str) -> np.ndarray:
        """(3, n) ids of one row's (or sample's) n tokens, counted from 0; takes its grids from ``used``."""
        parts, cur, i = [], 0, 0
        while i < row.size:
            j = i
            while j < row.size and row[j] == row[i]:
                j += 1
            kind, n = int(row[i]), j - i
            if kind == 0:
                parts.append(np.broadcast_to(np.arange(cur, cur + n), (3, n)))
                cur += n
            else:
                table = grids[kind]
                name = "image_grid_thw" if kind == 1 else "video_grid_thw"
                if table is None or used[kind] >= table.shape[0]:
                    raise ConfigError(f"{where} has more {name[:5]} runs than {name} grids")
                t, h, w = (int(v) for v in table[used[kind]])
                used[kind] += 1
                gh, gw = h // m, w // m
                if t * gh * gw != n:
                    raise ConfigError(f"{where}: a run of {n} {name[:5]} tokens at index {i} does not fit grid "
                                      f"(t, h, w) = {(t, h, w)} with spatial_merge_size {m}; expected "
                                      f"{t * gh * gw} tokens")
                steps = np.arange(t)
                if kind == 2 and intervals is not None:                  # float32 product, truncated, as HF
                    steps = (steps.astype(np.float32) * intervals[used[kind] - 1]).astype(np.int64)
                tt, hh, ww = np.meshgrid(steps, np.arange(gh), np.arange(gw), indexing="ij")
                parts.append(np.stack([tt, hh, ww]).reshape(3, -1) + cur)
                cur += max(h, w) // m
            i = j
        return np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), dtype=np.int64)

    def delta_of(pos: np.ndarray) -> int:
        return (int(pos.max()) + 1 if pos.size else 0) - pos.shape[1]

    out = np.zeros((3, *types.shape), dtype=np.int64)
    if cu_seqlens is not None:
        if attention_mask is not None:
            raise ConfigError("attention_mask given together with cu_seqlens; a packed row has no padding: "
                              "pass one or the other")
        if types.shape[0] != 1:
            raise ConfigError(f"a packed row is one row: with cu_seqlens expected token_types (1, T) or (T,), "
                              f"got shape {tuple(np.asarray(token_types).shape)}")
        cu = check_cu_seqlens(cu_seqlens, types.shape[1])
        deltas = np.zeros((cu.size - 1, 1), dtype=np.int64)
        for s, (a, b) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
            out[:, 0, a:b] = pos = ids_of(types[0, a:b], f"sample {s} (tokens {a}:{b})")
            deltas[s, 0] = delta_of(pos)
        return out, deltas
    mask = np.ones(types.shape, dtype=bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    deltas = np.zeros((types.shape[0], 1), dtype=np.int64)
    for b in range(types.shape[0]):
        out[:, b, mask[b]] = pos = ids_of(types[b][mask[b]], f"row {b}")
        deltas[b, 0] = delta_of(pos)
    return out, deltas


class MRopeSettings:
    """Frequencies (F,) float64, attention factor and the frequency -> axis map of an M-RoPE layer, checked.

    Built once by every ``MRotaryEmbedding`` constructor (both backends), with the same checks and messages.
    """

    def __init__(self, head_dim: Any, *, base: Any, max_seq_len: Any, scaling: Any, mrope_section: Any,
                 mrope_layout: Any, qk_layout: Any, num_heads: Any) -> None:
        self.head_dim = check_int("head_dim", head_dim, minimum=2)
        if self.head_dim % 2:
            raise ConfigError(f"M-RoPE needs an even head_dim, got {self.head_dim}")
        self.max_seq_len = check_int("max_seq_len", max_seq_len, minimum=1)
        params = normalize_rope_scaling(scaling, max_position_embeddings=self.max_seq_len)
        if params["rope_type"] in MROPE_REFUSED_TYPES:
            raise ConfigError(f"M-RoPE supports static scalings; got rope_type {params['rope_type']!r} "
                              f"(expected one not in {list(MROPE_REFUSED_TYPES)})")
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            raise ConfigError("M-RoPE with a partial rotary factor is not supported; expected 1.0, got "
                              f"{params['partial_rotary_factor']}")
        self.scaling = params
        inv, self.attention_factor = rope_inv_freq(self.head_dim, base=base, scaling=params,
                                                   max_position_embeddings=self.max_seq_len)
        self.inv_freq: np.ndarray = inv
        self.base = float(params.get("rope_theta", base))
        self.mrope_layout = check_choice("mrope_layout", mrope_layout, MROPE_LAYOUTS)
        self.mrope_section = [int(s) for s in mrope_section] if isinstance(mrope_section, (list, tuple)) \
            else mrope_section
        self.axis_map = mrope_axis_map(mrope_section, inv.shape[0], layout=self.mrope_layout)
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)
