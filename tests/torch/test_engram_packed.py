"""EngramMemory beyond the reference's whole (B, L) sequences: packed documents (``cu_seqlens``) equal to each
document alone through the reference's own ``Engram.forward``, and decoding with an ``EngramCache`` (one token or
a chunk per call, (B, L) or packed) equal to the whole sequence's forward, gradients included; the cache's
contents, beam reordering, and bad inputs refused by name with the cache left as it was.

Equality is to rounding (``forward.float64`` / ``forward.float32``): the chunked calls run the same linear
layers and convolution on other shapes, which may sum in another order."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.ngram_cases import CASES, LAYER_IDS, PAD_ID, V_OLD, make_compress, make_ids, reference_mapping, settings
from tests.ngram_reference import BackBoneConfig, Engram, EngramConfig
from tests.tolerances import TOL
from tokenpos.tables.errors import ConfigError, DtypeError, PositionError, TokenIdError
from tokenpos.torch import EngramMemory
from tokenpos.torch.engram import EngramCache

D, K = 8, 3                                         # hidden size, kernel size: W = (K - 1) * max_ngram_size


def _pair(hc_mult: int, case: Any = CASES[3], layer_id: int = 15, dtype: torch.dtype = torch.float64
          ) -> tuple[Engram, EngramMemory]:
    """The reference Engram (weights moved off their init) and an EngramMemory loaded from it."""
    n_max, heads, dim, sizes = case
    cfg = EngramConfig(engram_vocab_size=sizes, max_ngram_size=n_max, n_embed_per_ngram=dim, n_head_per_ngram=heads,
                       layer_ids=LAYER_IDS, pad_id=PAD_ID, seed=0, kernel_size=K)
    backbone = BackBoneConfig(hidden_size=D, hc_mult=hc_mult, vocab_size=V_OLD, num_layers=16)
    torch.manual_seed(0)
    ref = Engram(layer_id, cfg, backbone, reference_mapping(case)).to(dtype)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, dtype=p.dtype) * 0.1)
    ours = EngramMemory(D, hc_mult=hc_mult, kernel_size=K, **{
        k: v for k, v in settings(case, layer_id).items() if k != "compress"}, compress=make_compress(0),
        dtype=dtype, init_seed=0)
    ours.load_reference_state_dict(ref.state_dict())
    return ref, ours


def _hidden(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 3) -> torch.Tensor:
    return torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return TOL["forward.float64" if dtype == torch.float64 else "forward.float32"]


# documents of lengths 5, 0, 1, 17 (longer than W = 8) and 2 (shorter than the n-gram context C = 3)
LENGTHS = [5, 0, 1, 17, 2]


def _documents(hc_mult: int, dtype: torch.dtype) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    ids = torch.from_numpy(make_ids((sum(LENGTHS),), seed=4))
    h = _hidden((sum(LENGTHS), hc_mult, D), dtype)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()])
    spans = list(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))
    return [ids[a:b] for a, b in spans], [h[a:b] for a, b in spans], cu


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hc_mult", [1, 4])
def test_packed_documents_equal_the_reference_on_each_alone(hc_mult: int, dtype: torch.dtype) -> None:
    ref, ours = _pair(hc_mult, dtype=dtype)
    ids, hs, cu = _documents(hc_mult, dtype)
    got = ours(torch.cat(hs), torch.cat(ids), cu_seqlens=cu)                       # (T, G, D)
    assert got.shape == (sum(LENGTHS), hc_mult, D)
    want = torch.cat([ref(h[None], i[None].numpy())[0] for h, i in zip(hs, ids, strict=True) if len(i)])
    torch.testing.assert_close(got, want, **_tol(dtype))
    g = _hidden(got.shape, dtype, seed=5)
    (got * g).sum().backward()
    (want * g).sum().backward()
    for name in ("short_conv.conv.weight", "value_proj.weight", "key_projs.0.weight", "norm2.0.weight"):
        torch.testing.assert_close(ours.get_parameter(name).grad, ref.get_parameter(name).grad,
                                   **TOL["grad.float64" if dtype == torch.float64 else "grad.float32"])
    torch.testing.assert_close(ours.multi_head_embedding.weight.grad, ref.multi_head_embedding.embedding.weight.grad,
                               **TOL["grad.float64" if dtype == torch.float64 else "grad.float32"])


def _chunked(ours: EngramMemory, h: torch.Tensor, ids: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    cache = ours.new_cache(h.shape[0])
    spans = zip(bounds[:-1], bounds[1:], strict=True)
    return torch.cat([ours(h[:, a:b], ids[:, a:b], cache=cache) for a, b in spans], dim=1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hc_mult", [1, 4])
def test_decoding_step_by_step_and_in_chunks_equals_the_whole_sequence(hc_mult: int, dtype: torch.dtype) -> None:
    _, ours = _pair(hc_mult, dtype=dtype)
    L = 19
    ids = torch.from_numpy(make_ids((2, L)))
    h = _hidden((2, L, hc_mult, D), dtype)
    with torch.no_grad():
        full = ours(h, ids)
        one = _chunked(ours, h, ids, list(range(L + 1)))                         # one token per call
        # a prefill shorter than the context, an empty chunk, one token, a chunk longer than W
        chunks = _chunked(ours, h, ids, [0, 2, 2, 3, 14, 19])
    torch.testing.assert_close(one, full, **_tol(dtype))
    torch.testing.assert_close(chunks, full, **_tol(dtype))


def test_gradients_flow_through_the_cache_as_through_the_whole_sequence() -> None:
    """The cache's tensors are replaced, never written into: a backward through three chunks gives the whole
    sequence's gradients (the later chunks' convolution reads the earlier chunks' values)."""
    _, ours = _pair(4)
    ids = torch.from_numpy(make_ids((2, 13)))
    h = _hidden((2, 13, 4, D), torch.float64).requires_grad_()
    g = _hidden((2, 13, 4, D), torch.float64, seed=6)
    (ours(h, ids) * g).sum().backward()
    want = {n: p.grad.clone() for n, p in ours.named_parameters()}
    want_h = h.grad.clone()
    ours.zero_grad()
    h.grad = None
    (_chunked(ours, h, ids, [0, 4, 5, 13]) * g).sum().backward()
    for n, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, want[n], **TOL["grad.float64"])
    torch.testing.assert_close(h.grad, want_h, **TOL["grad.float64"])


@pytest.mark.parametrize("hc_mult", [1, 4])
def test_packed_decoding_with_a_cache_per_document_equals_each_document_alone(hc_mult: int) -> None:
    """Continuous batching: every call packs a chunk of each document (some empty), one cache of S documents."""
    ref, ours = _pair(hc_mult)
    ids, hs, _ = _documents(hc_mult, torch.float64)
    S = len(LENGTHS)
    splits = [[0, 2, 3, 5], [0, 0, 0, 0], [0, 0, 1, 1], [0, 9, 10, 17], [0, 1, 1, 2]]   # per document, 3 calls
    cache = ours.new_cache(S)
    outs: list[list[torch.Tensor]] = [[] for _ in range(S)]
    with torch.no_grad():
        for k in range(3):
            parts = [(s, splits[s][k], splits[s][k + 1]) for s in range(S)]
            cu = torch.tensor([0, *torch.tensor([b - a for _, a, b in parts]).cumsum(0).tolist()])
            out = ours(torch.cat([hs[s][a:b] for s, a, b in parts]), torch.cat([ids[s][a:b] for s, a, b in parts]),
                       cu_seqlens=cu, cache=cache)
            for s in range(S):
                outs[s].append(out[cu[s]:cu[s + 1]])
        for s in range(S):
            if LENGTHS[s]:
                want = ref(hs[s][None], ids[s][None].numpy())[0]
                torch.testing.assert_close(torch.cat(outs[s]), want, **TOL["forward.float64"])


def test_the_cache_holds_the_last_ids_and_normalised_values() -> None:
    _, ours = _pair(4)
    C, W = 3, (K - 1) * 4
    assert ours.short_conv.window == W
    cache = ours.new_cache(2)
    assert cache.ids.shape == (2, C) and bool((cache.ids == PAD_ID).all())
    assert cache.conv.shape == (2, W, 4 * D) and not cache.conv.any() and cache.batch_size == 2
    ids = torch.from_numpy(make_ids((2, 2)))
    h = _hidden((2, 2, 4, D), torch.float64)
    with torch.no_grad():
        ours(h, ids, cache=cache)
    assert torch.equal(cache.ids, torch.cat([torch.full((2, 1), PAD_ID), ids], dim=1))   # fewer than C: pads
    with torch.no_grad():
        e = ours.multi_head_embedding(ids)
        v = torch.stack([torch.sigmoid(_gate(ours, e, h, g)) for g in range(4)], dim=2)[..., None] \
            * ours.value_proj(e)[:, :, None]
        normed = torch.cat([ours.short_conv.norms[g](v[:, :, g]) for g in range(4)], dim=-1)   # (2, 2, 4 * D)
    torch.testing.assert_close(cache.conv[:, -2:], normed, **TOL["forward.float64"])
    assert not cache.conv[:, :-2].any()                                            # before the start: zeros


def _gate(m: EngramMemory, e: torch.Tensor, h: torch.Tensor, g: int) -> torch.Tensor:
    """The reference's gate formula, written out (before the sigmoid)."""
    x = (m.norm1[g](m.key_projs[g](e)) * m.norm2[g](h[:, :, g])).sum(-1) / D ** 0.5
    return x.abs().clamp_min(1e-6).sqrt() * x.sign()


def test_reorder_cache_continues_the_beams_it_picks() -> None:
    _, ours = _pair(1)
    ids = torch.from_numpy(make_ids((3, 12)))
    h = _hidden((3, 12, 1, D), torch.float64)
    beams = torch.tensor([2, 0, 2])
    with torch.no_grad():
        cache = ours.new_cache(3)
        ours(h[:, :7], ids[:, :7], cache=cache)
        cache.reorder_cache(beams)
        got = ours(h[beams, 7:], ids[beams, 7:], cache=cache)
        want = ours(h[beams], ids[beams])[:, 7:]
    torch.testing.assert_close(got, want, **TOL["forward.float64"])


def test_bad_inputs_are_refused_by_name_and_leave_the_cache_as_it_was() -> None:
    _, ours = _pair(4)
    ids = torch.from_numpy(make_ids((2, 5)))
    h = _hidden((2, 5, 4, D), torch.float64)
    cache = ours.new_cache(2)
    before = (cache.ids, cache.conv)
    bad = ids.clone()
    bad[1, 3] = V_OLD + 1
    with pytest.raises(TokenIdError, match=rf"token id {V_OLD + 1} at index \(1, 3\)"):
        ours(h, bad, cache=cache)
    with pytest.raises(ConfigError, match=r"cache holds ids \(2, 3\) and conv \(2, 8, 32\); expected ids \(3, 3\)"):
        ours(_hidden((3, 5, 4, D), torch.float64), torch.from_numpy(make_ids((3, 5))), cache=cache)
    with pytest.raises(ConfigError, match="cache must be an EngramCache"):
        ours(h, ids, cache=(cache.ids, cache.conv))
    with pytest.raises(DtypeError, match="cache.conv torch.float64"):
        ours(h, ids, cache=EngramCache(cache.ids, cache.conv.float()))
    assert cache.ids is before[0] and cache.conv is before[1]                     # the same tensors: untouched
    flat_ids, flat_h = ids.reshape(-1), h.reshape(10, 4, D)
    with pytest.raises(ConfigError, match=r"packed hidden_states \(with cu_seqlens\) must be \(T, 4, 8\)"):
        ours(h, flat_ids, cu_seqlens=torch.tensor([0, 4, 10]))
    with pytest.raises((ConfigError, PositionError), match="cu_seqlens"):
        ours(flat_h, flat_ids, cu_seqlens=torch.tensor([0, 4, 9]))               # does not end at T = 10
    with pytest.raises(PositionError, match=r"cu_seqlens must end at the number of tokens T = 9"):
        ours(flat_h, flat_ids[:9], cu_seqlens=torch.tensor([0, 4, 10]))
    with pytest.raises(ConfigError, match=r"expected ids \(3, 3\) and conv \(3, 8, 32\) for the call's 3 documents"):
        ours(flat_h, flat_ids, cu_seqlens=torch.tensor([0, 4, 4, 10]), cache=cache)
    assert cache.ids is before[0] and cache.conv is before[1]


@pytest.mark.slow                                   # 6 s on 2 busy cores: dynamo traces the module
def test_a_decoding_step_compiles_in_one_graph_and_updates_the_cache() -> None:
    """``torch.compile(fullgraph=True)`` traces the cache's read and replacement (no graph break): steps of the
    compiled module equal the whole sequence's eager forward."""
    _, ours = _pair(4)
    ids = torch.from_numpy(make_ids((2, 6)))
    h = _hidden((2, 6, 4, D), torch.float64)
    compiled = torch.compile(ours, backend="eager", fullgraph=True, dynamic=False)
    with torch.no_grad():
        full = ours(h, ids)
        cache = ours.new_cache(2)
        steps = [compiled(h[:, t:t + 1], ids[:, t:t + 1], cache=cache) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL["forward.float64"])
    assert torch.equal(cache.ids, ids[:, -3:])
