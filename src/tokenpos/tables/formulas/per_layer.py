"""Per-layer embeddings (Gemma 3n, Gemma 4): the row multiplier and the id mapping, as HF computes them.

Both backends' ``PerLayerEmbedding`` read their scale, their ``out_of_range="zero"`` mapping, their checked
settings (:func:`per_layer_args`) and their ``extra_repr`` head (:func:`per_layer_repr`) here.
HF's table is a ``*TextScaledWordEmbedding`` built with ``embed_scale=P ** 0.5``, which it keeps as
``torch.tensor(P ** 0.5)`` (a float32 buffer) and multiplies as ``W[ids] * embed_scale.to(W.dtype)``:
the scale is rounded to float32, then to the table's dtype, and the product is rounded once to that
dtype. :func:`per_layer_multiplier` is that rounded scale; the gather multiplies in float32 for
float16 / bfloat16 tables (exact for two such values) and rounds once, so the rows equal HF's bit for bit.

Shapes: V vocab, L layers, P per-layer width, ids (...).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.validation import (
    check_bool,
    check_choice,
    check_padding_idx,
    check_positive_int,
    index_array,
)
from tokenpos.tables.formulas.init import INIT_SCHEMES

MULTIPLIER_DTYPES = ("float16", "bfloat16", "float32", "float64")
OUT_OF_RANGE = ("raise", "zero")
"""What a per-layer table does with an id >= V: "raise" (``TokenIdError``, as every tokenpos table) or
"zero" (HF Gemma 3n's ``get_per_layer_inputs``: the id reads row 0; negative ids are refused either way)."""


def per_layer_args(vocab_size: Any, num_layers: Any, dim: Any, scale: Any, padding_idx: Any, out_of_range: Any,
                   init: Any) -> tuple[int, int, int, bool, int | None, str, str]:
    """``(V, L, P, scale, padding_idx, out_of_range, init)`` of a per-layer table, checked (ConfigError naming
    the setting, the value and what was expected). Both layers call it with the same arguments, so they accept
    and refuse the same settings with the same messages; the backend-typed ones (dtype, weight_dtype, sparse)
    stay with each layer."""
    vocab_size = check_positive_int("vocab_size", vocab_size)
    return (vocab_size, check_positive_int("num_layers", num_layers), check_positive_int("dim", dim),
            check_bool("scale", scale), check_padding_idx(padding_idx, vocab_size),
            check_choice("out_of_range", out_of_range, OUT_OF_RANGE), check_choice("init", init, INIT_SCHEMES))


def per_layer_repr(vocab_size: int, num_layers: int, dim: int, padding_idx: int | None, scale: bool,
                   out_of_range: str) -> str:
    """The head of both layers' ``extra_repr``: ``"V, L, P"`` and the settings that differ from the defaults."""
    s = f"{vocab_size}, {num_layers}, {dim}"
    if padding_idx is not None:
        s += f", padding_idx={padding_idx}"
    if not scale:
        s += ", scale=False"
    if out_of_range != "raise":
        s += f", out_of_range={out_of_range!r}"
    return s


def round_to_bfloat16(x: float) -> float:
    """``x`` rounded to float32, then to bfloat16 (round to nearest, ties to even), as a Python float.
    For finite values (the scales here): torch's ``float32 -> bfloat16`` cast."""
    bits = np.array(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)) << np.uint64(16)
    return float(np.array(rounded, dtype=np.uint32).view(np.float32))


def per_layer_multiplier(dim: int, dtype: str) -> float:
    """The float HF multiplies a per-layer table of ``dtype`` by: ``dim ** 0.5`` rounded to float32 (HF's
    ``embed_scale`` buffer), then to ``dtype`` (``embed_scale.to(W.dtype)``). A float64 table is scaled by the
    float32 value too, as HF's is.

    Args:
        dim: P, the per-layer width (``hidden_size_per_layer_input``).
        dtype: the table's dtype name, one of :data:`MULTIPLIER_DTYPES`.
    """
    check_positive_int("dim", dim)
    check_choice("dtype", dtype, MULTIPLIER_DTYPES)
    scale = np.float32(dim ** 0.5)                          # HF: torch.tensor(embed_scale), default float32
    if dtype == "bfloat16":
        return round_to_bfloat16(float(scale))
    return float(np.asarray(scale).astype(dtype))


def zero_out_of_range(ids: Any, vocab_size: int) -> Any:
    """HF Gemma 3n's mapping of ids outside the per-layer table (multimodal ids >= V) to row 0:
    ids (...) -> (...) with every id >= ``vocab_size`` replaced by 0. Negative ids pass unchanged, and so does
    anything that is not an integer array (a float array, a bool array): the id check that follows refuses
    them with the shared message (HF maps negative ids to row 0 too; here they are an error).
    """
    arr = index_array(ids)
    if arr.dtype.kind not in "iu":
        return arr
    return np.where(arr < vocab_size, arr, 0).astype(arr.dtype, copy=False)

