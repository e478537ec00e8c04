"""embedding_forward(bf16=True) against torch's bf16 plain path computed in float32 and rounded once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpos.kernels import embedding_forward
from tokenpos.kernels.reference import bf16_to_float32, embedding_forward_ref, float32_to_bf16
from tokenpos.tables.errors import ConfigError, TokenIdError

torch = pytest.importorskip("torch")

from tokenpos.torch._dropout import dropout_multiplier_torch  # noqa: E402


def bits(t: torch.Tensor) -> np.ndarray:
    """The bf16 tensor's bits as a uint16 array (what a torch caller passes to the kernel)."""
    return t.view(torch.int16).numpy().view(np.uint16)


def torch_plain(W, ids, scale, P, pos, p, seed) -> torch.Tensor:
    """The plain bf16 path of the rule: gather, widen to fp32, w*scale + pos, * m, round once."""
    y = W.float()[torch.from_numpy(ids)] * scale
    if P is not None:
        y = y + P.float()[torch.from_numpy(pos)]
    if p:
        y = y * dropout_multiplier_torch(seed, tuple(y.shape), p)
    return y.bfloat16()


def assert_same_bits(got: np.ndarray, want: torch.Tensor) -> None:
    w = bits(want)
    nan_w = np.isnan(bf16_to_float32(w))
    assert np.array_equal(np.isnan(bf16_to_float32(got)), nan_w)     # NaN payloads may differ
    assert np.array_equal(got[~nan_w], w[~nan_w])


@settings(max_examples=25, deadline=None)
@given(V=st.integers(1, 30), D=st.integers(1, 80), B=st.integers(1, 3), L=st.integers(1, 9),
       p=st.sampled_from([0.0, 0.1, 0.5]), has_pos=st.booleans(), seed=st.integers(0, 2**63 - 1),
       data_seed=st.integers(0, 2**32 - 1))
def test_bf16_forward_equals_torch_rounded_once(V, D, B, L, p, has_pos, seed, data_seed) -> None:
    g = torch.Generator().manual_seed(data_seed)
    W = (torch.randn(V, D, generator=g) * 3).bfloat16()
    P = torch.randn(L, D, generator=g).bfloat16() if has_pos else None
    ids = np.random.default_rng(data_seed).integers(0, V, (B, L))
    pos = np.arange(L) if has_pos else None
    scale = float(np.sqrt(D))
    got = embedding_forward(bits(W), ids, scale=scale, pos_table=None if P is None else bits(P), pos_ids=pos,
                            dropout_p=p, seed=seed, bf16=True)
    assert got.dtype == np.uint16 and got.shape == (B, L, D)
    want = torch_plain(W, ids, scale, P, pos, p, seed)
    assert_same_bits(got, want)
    ref = embedding_forward_ref(bits(W), ids, scale=scale, pos_table=None if P is None else bits(P),
                                pos_ids=pos, dropout_p=p, seed=seed, bf16=True)
    assert np.array_equal(got, ref)


def test_bf16_ties_round_to_even_and_specials() -> None:
    """1 + 2**-8 is a tie between two bf16 values: it rounds to the even one; NaN/Inf/-0 survive."""
    one, tie = 0x3F80, 0x3B80                          # 1.0 and 2**-8 in bf16 bits
    W = np.array([[one], [0x3F81], [0x7F80], [0x8000], [0x7FC0], [0x7F7F]], np.uint16)  # 1, 1+2^-7, inf, -0, nan, max
    P = np.array([[tie], [0]], np.uint16)
    ids = np.array([0, 1, 2, 3, 4, 5, 5])
    pos = np.array([0, 0, 0, 1, 0, 1, 0])
    got = embedding_forward(W, ids, pos_table=P, pos_ids=pos, bf16=True)[:, 0]
    assert got[0] == 0x3F80                            # 1 + 2^-8 -> 1.0 (even)
    assert got[1] == 0x3F82                            # (1 + 2^-7) + 2^-8 -> 1 + 2^-6 (even)
    assert got[2] == 0x7F80 and got[3] == 0x0000 and got[4] == 0x7FC0   # -0 + +0 = +0
    assert got[5] == 0x7F7F                            # max + 0 stays max
    Wt = torch.from_numpy(W.view(np.int16)).view(torch.bfloat16)
    Pt = torch.from_numpy(P.view(np.int16)).view(torch.bfloat16)
    assert_same_bits(got[:, None], torch_plain(Wt, ids, 1.0, Pt, pos, 0.0, 0))


@pytest.mark.parametrize("has_pos", [True, False])
@pytest.mark.parametrize("offset", [0, 1])      # 1: an out that is not 4-byte aligned
def test_bf16_rows_match_torch_on_every_bit_pattern(has_pos: bool, offset: int) -> None:
    """Every bf16 bit pattern (NaN, Inf, subnormals, ties) rounds as torch does, aligned or not."""
    rng = np.random.default_rng(5)
    V, D, L = 64, 64, 8
    allbits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    P = torch.from_numpy(rng.integers(0, 1 << 16, (L, D)).astype(np.uint16).view(np.int16)).view(torch.bfloat16)
    for start in range(0, 1 << 16, V * D):
        W = torch.from_numpy(allbits[start:start + V * D].reshape(V, D).view(np.int16).copy()).view(torch.bfloat16)
        ids = rng.permutation(V).reshape(V // L, L)
        pos = np.arange(L) if has_pos else None
        buf = np.empty(V * D + 1, np.uint16)
        out = buf[offset:offset + V * D].reshape(V // L, L, D)
        got = embedding_forward(bits(W), ids, scale=1.5, pos_table=bits(P) if has_pos else None, pos_ids=pos,
                                out=out, bf16=True)
        assert_same_bits(got, torch_plain(W, ids, 1.5, P if has_pos else None, pos, 0.0, 0))


def test_float32_to_bf16_matches_torch_on_every_exponent() -> None:
    rng = np.random.default_rng(3)
    u = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    u[:4] = [0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x00008000]   # ties and overflow to inf
    x = u.view(np.float32)
    want = torch.from_numpy(x.copy()).bfloat16()
    assert_same_bits(float32_to_bf16(x), want)


def test_bf16_accepts_int16_views_and_writes_into_out() -> None:
    W = torch.randn(7, 16).bfloat16()
    ids = np.array([[1, 6, 0]])
    out = torch.empty(1, 3, 16, dtype=torch.bfloat16)
    res = embedding_forward(W.view(torch.int16).numpy(), ids, scale=2.0, out=out.view(torch.int16).numpy(),
                            bf16=True)
    assert res.dtype == np.int16
    assert torch.equal(out, (W.float()[torch.from_numpy(ids)] * 2.0).bfloat16())


def test_bf16_errors() -> None:
    W = np.zeros((4, 3), np.uint16)
    with pytest.raises(ConfigError, match="bf16 bits"):
        embedding_forward(W.astype(np.float32), np.array([0]), bf16=True)
    with pytest.raises(ConfigError):
        embedding_forward(W, np.array([0]), bf16=True, out=np.empty((1, 3), np.float32))
    with pytest.raises(TokenIdError, match="token id 4 at index"):
        embedding_forward(W, np.array([0, 4]), bf16=True)
