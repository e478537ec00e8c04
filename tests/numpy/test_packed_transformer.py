"""NumPy TransformerEmbedding(cu_seqlens=...): a packed row gives, per token, the output and the
gradients of the same documents padded in (N, L); its backward matches finite differences."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tokenpos.numpy as tpn
from tests.numpy.gradcheck import check_grads
from tokenpos.tables import ConfigError, DtypeError, PositionError, TokenIdError

V, D, H, P = 23, 8, 2, 16
LENGTHS = [3, 5, 1, 4]
CU = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int32)
T, L = int(CU[-1]), max(LENGTHS)
CASES = {
    "learned": dict(positional="learned"),
    "sinusoidal": dict(positional="sinusoidal", scale=True),
    "learned-bert": dict(positional="learned", num_token_types=2, norm="layernorm"),
    "rope": dict(positional="rope", num_heads=H, norm="rmsnorm"),
    "alibi": dict(positional="alibi", num_heads=H),
    "t5": dict(positional="t5", num_heads=H),
}


def packed_and_padded(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """ids and token types packed (T,) and padded (N, L) (pads: id 0, type 0), and the (N, L) mask of real tokens."""
    rng = np.random.default_rng(seed)
    ids, tt = rng.integers(1, V, T), rng.integers(0, 2, T)
    mask = np.arange(L)[None, :] < np.array(LENGTHS)[:, None]                  # (N, L)
    ids_pad, tt_pad = np.zeros(mask.shape, np.int64), np.zeros(mask.shape, np.int64)
    ids_pad[mask], tt_pad[mask] = ids, tt
    return ids, tt, ids_pad, tt_pad, mask  # type: ignore[return-value]


def make(case: str) -> Any:
    return tpn.TransformerEmbedding(V, D, P, dtype=np.float64, seed=3, **CASES[case])


def call(emb: Any, ids: np.ndarray, tt: np.ndarray, **kw: Any) -> np.ndarray:
    return emb(ids, token_type_ids=tt if emb.num_token_types else None, **kw)


@pytest.mark.parametrize("case", list(CASES))
def test_packed_equals_padded_per_token_with_equal_gradients(case: str, kernel_mode: bool) -> None:
    ids, tt, ids_pad, tt_pad, mask = packed_and_padded()
    packed, padded = make(case), make(case)
    out = call(packed, ids, tt, cu_seqlens=CU)                                  # (T, D)
    ref = call(padded, ids_pad, tt_pad)                                         # (N, L, D)
    np.testing.assert_array_equal(out, ref[mask])                               # float64: exact
    np.testing.assert_array_equal(call(make(case), ids[None], tt[None], cu_seqlens=CU), out[None])   # (1, T)
    g = np.random.default_rng(1).standard_normal(out.shape)
    g_pad = np.zeros(ref.shape)
    g_pad[mask] = g
    packed.backward(g)
    padded.backward(g_pad)
    grads = dict(padded.named_parameters())
    for name, p in packed.named_parameters():
        if grads[name].grad is None:                                           # not used here (T5's bias table)
            assert p.grad is None, name
            continue
        np.testing.assert_allclose(p.grad, grads[name].grad, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("case", [pytest.param("learned", marks=pytest.mark.slow),
                                  pytest.param("learned-bert", marks=pytest.mark.slow), "sinusoidal"])
def test_packed_backward_matches_finite_differences(case: str) -> None:
    ids, tt, *_ = packed_and_padded()
    check_grads(lambda: make(case), ids, run=lambda emb, x: call(emb, x, tt, cu_seqlens=CU),
                tol="fd.nonlinear" if "bert" in case else "fd.linear", max_elems=40)


def test_a_position_past_a_learned_table_is_refused_per_document() -> None:
    emb = tpn.TransformerEmbedding(V, D, 4, dtype=np.float64, seed=0)
    emb(np.ones(8, np.int64), cu_seqlens=[0, 4, 8])                            # 8 tokens, documents of 4: fine
    with pytest.raises(PositionError, match="position 4 at index"):
        emb(np.ones(8, np.int64), cu_seqlens=[0, 3, 8])


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(positions=np.arange(T)), ConfigError, "positions given together with cu_seqlens"),
    (dict(start_pos=[0, 1]), ConfigError, r"one int per document, shape \(4,\); got shape \(2,\)"),
    (dict(start_pos=[0, 1, -1, 0]), PositionError, r"start_pos -1 at index \(2,\) is negative"),
    (dict(start_pos=[0, P - 4, 0, 0]), PositionError, rf"position {P} at index \(7,\) is out of range \[0, {P}\)"),
    (dict(cu_seqlens=np.array([0, 3, T - 1])), PositionError, f"must end at the number of tokens T = {T}"),
    (dict(cu_seqlens=np.array([0, 1, T + 2, T])), PositionError, r"cu_seqlens\[2\] ="),   # once written past T
    (dict(cu_seqlens=np.array([0, 1, 10**8, T])), PositionError, r"cu_seqlens\[2\] ="),
    (dict(cu_seqlens=np.array([0.0, T])), DtypeError, "int32 or int64 vector"),
])
def test_bad_packed_calls_are_refused_and_change_nothing(kwargs: dict[str, Any], error: type, text: str) -> None:
    ids, *_ = packed_and_padded()
    emb = make("learned")
    emb(ids, cu_seqlens=CU)
    before = emb._cache
    with pytest.raises(error, match=text):
        emb(ids, **{"cu_seqlens": CU, **kwargs})
    assert emb._cache is before


def test_more_than_one_row_padding_positions_and_bad_ids_are_refused() -> None:
    ids, _, ids_pad, *_ = packed_and_padded()
    with pytest.raises(ConfigError, match=r"a packed batch is one row: .*got shape \(4, 5\)"):
        make("learned")(ids_pad, cu_seqlens=CU)
    roberta = tpn.TransformerEmbedding(V, D, P, padding_idx=0, position_ids="padding", seed=0)
    with pytest.raises(ConfigError, match="position_ids='padding'"):
        roberta(ids, cu_seqlens=CU)
    bad = ids.copy()
    bad[2] = V
    with pytest.raises(TokenIdError):                                          # the ids first, as always
        make("learned")(bad, cu_seqlens=np.array([1.0]))


@pytest.mark.parametrize("case", ["learned", "sinusoidal", "learned-bert"])
def test_document_starts_give_each_document_its_call_at_that_start_pos(case: str) -> None:
    """Documents continuing a KV cache, packed: start_pos (one per document, or one int) shifts each document's
    positions, so each document's rows equal the layer called on it alone with that start_pos, and the packed
    backward accumulates what the separate calls' backwards do."""
    ids, tt, *_ = packed_and_padded()
    packed, alone = make(case), make(case)
    g = np.random.default_rng(1).standard_normal((T, D))
    for starts in ([0, 4, 11, 2], np.array([5, 0, 1, 9]), 3):
        out = call(packed, ids, tt, cu_seqlens=CU, start_pos=starts)
        packed.backward(g)
        per_doc = [starts] * 4 if isinstance(starts, int) else list(starts)
        for a, b, s in zip(CU[:-1], CU[1:], per_doc, strict=True):
            np.testing.assert_array_equal(out[a:b], call(alone, ids[a:b], tt[a:b], start_pos=s))
            alone.backward(g[a:b])
    grads = dict(alone.named_parameters())
    for name, p in packed.named_parameters():
        np.testing.assert_allclose(p.grad, grads[name].grad, rtol=1e-12, atol=1e-12, err_msg=name)
