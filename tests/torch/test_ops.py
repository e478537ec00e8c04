"""tokenpos's torch custom ops: opcheck on every sample, kernel == plain path, gradients, double
backward, vmap and per-sample gradients (kernels on and off)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.library import opcheck

import tokenpos.torch.ops as ops
from tests.tolerances import TOL
from tokenpos import use_kernels
from tokenpos.tables.formulas.dropout import dropout_keep_mask

SAMPLES = list(ops.samples())
OPS = torch.ops.tokenpos


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    tol = TOL["kernels.float64" if a.dtype == torch.float64 else "kernels.float32"]
    torch.testing.assert_close(a, b, rtol=tol["rtol"], atol=tol["atol"])


def _outputs(x: object) -> tuple[torch.Tensor, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)  # type: ignore[arg-type]


def test_samples_cover_every_op() -> None:
    names = {op._name for op, _, _ in SAMPLES}
    assert names == {"embedding", "embedding_backward", "rope", "rope_qk", "rope_backward", "rope_qk_backward",
                     "tied_cross_entropy", "tied_cross_entropy_backward", "ngram_embedding",
                     "ngram_embedding_backward", "quantized_embedding"}
    dtypes = {a.dtype for op, args, _ in SAMPLES for a in args[:1] if op._name != "quantized_embedding"}
    assert dtypes == {torch.float32, torch.float64}
    eight_bit = {(args[0].dtype, args[1].dtype, args[4]) for op, args, _ in SAMPLES
                 if op._name == "quantized_embedding"}                  # (q, scale, float8: q holds float8 bits)
    assert eight_bit == {(q, s, q == torch.uint8) for q in (torch.int8, torch.uint8)
                         for s in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}
    assert {args[0].requires_grad for _, args, _ in SAMPLES} == {False, True}


@pytest.mark.slow  # opcheck of every sample (fast: test_kernel_forward_equals_plain_path_bit_for_bit)
@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("i", range(len(SAMPLES)))
def test_opcheck(i: int, kernels: bool) -> None:
    op, args, kwargs = SAMPLES[i]
    with use_kernels(kernels):
        opcheck(op, args, kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the Triton / CUDA paths of every op")
@pytest.mark.parametrize("i", range(len(SAMPLES)))
def test_opcheck_on_cuda(i: int) -> None:  # pragma: no cover - GPU only
    """The same samples on the GPU (strided, transposed and expanded ones included): opcheck compares
    the real outputs' strides with the fake implementation's, and the eager, compiled and autograd
    results with each other."""
    op, args, kwargs = list(ops.samples("cuda"))[i]
    opcheck(op, args, kwargs)


# float64 sums vs index_add_ (the tied loss has one CPU path, plain torch: bit for bit, issue 33)
ROUNDING_ONLY = ("embedding_backward", "ngram_embedding_backward")


@pytest.mark.parametrize("i", range(len(SAMPLES)))
def test_kernel_forward_equals_plain_path_bit_for_bit(i: int) -> None:
    """Same values without dropout, the same dropout masks with it (kernels vs plain torch); the embedding
    backward's sums to rounding."""
    op, args, kwargs = SAMPLES[i]
    args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    fused = _outputs(op(*args, **kwargs))
    with use_kernels(False):
        plain = _outputs(op(*args, **kwargs))
    for f, p in zip(fused, plain, strict=True):
        if op._name in ROUNDING_ONLY:
            _close(f, p)
        else:
            assert torch.equal(f, p)


def test_dropout_mask_is_the_shared_counter_hash() -> None:
    w = torch.randn(7, 5) + 3.0                                # no zero entries
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    for kernels in (True, False):
        with use_kernels(kernels):
            out = OPS.embedding(w, ids, None, None, 1.0, 0.4, torch.tensor(99), -1)
        keep = torch.from_numpy(dropout_keep_mask(99, (2, 3, 5), 0.4))
        assert torch.equal(out != 0, keep)
        assert torch.equal(out[keep], (w[ids] * (1 / 0.6))[keep])


def _embedding_args(dtype: torch.dtype, p: float, pad: int) -> tuple:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(9, 4, generator=g, dtype=dtype, requires_grad=True)
    t = torch.randn(6, 4, generator=g, dtype=dtype, requires_grad=True)
    ids = torch.tensor([[1, 2, 2, 0], [3, 3, 8, 0]])
    pos = torch.tensor([0, 5, 2, 2])
    return w, ids, t, pos, 2.0, p, torch.tensor(5), pad


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_equal_plain_path(dtype: torch.dtype, p: float) -> None:
    args = _embedding_args(dtype, p, 2)
    grads = []
    for kernels in (True, False):
        with use_kernels(kernels):
            w, t = args[0], args[2]
            out = OPS.embedding(*args)
            gw, gt = torch.autograd.grad((out * out.detach()).sum(), (w, t))
            grads.append((gw, gt))
    assert grads[0][0][2].abs().max() == 0                      # padding_idx gets no gradient
    for a, b in zip(*grads, strict=True):
        _close(a, b)


@pytest.mark.slow  # gradgradcheck
@pytest.mark.parametrize("kernels", [True, False])
def test_gradcheck_and_double_backward(kernels: bool) -> None:
    """float64 gradcheck and gradgradcheck through both ops (the backward op is differentiable).

    No padding_idx here: its row is used by the forward but gets no gradient (F.embedding's rule).
    """
    w, ids, t, pos, scale, p, seed, pad = _embedding_args(torch.float64, 0.3, -1)
    with use_kernels(kernels):
        fn = lambda w, t: OPS.embedding(w, ids, t, pos, scale, p, seed, pad) ** 2  # noqa: E731
        assert torch.autograd.gradcheck(fn, (w, t))
        assert torch.autograd.gradgradcheck(fn, (w, t))
        x = torch.randn(2, 3, 4, 8, dtype=torch.float64, requires_grad=True)
        k = torch.randn(2, 1, 4, 8, dtype=torch.float64, requires_grad=True)
        ang = torch.rand(4, 3, dtype=torch.float64)
        for interleaved in (False, True):
            fr = lambda x, il=interleaved: OPS.rope(x, ang.cos(), ang.sin(), il) ** 2  # noqa: E731
            fqk = lambda x, k, il=interleaved: [o ** 2 for o in OPS.rope_qk(x, k, ang.cos(), ang.sin(), il)]  # noqa: E731
            assert torch.autograd.gradcheck(fr, (x,)) and torch.autograd.gradgradcheck(fr, (x,))
            assert torch.autograd.gradcheck(fqk, (x, k)) and torch.autograd.gradgradcheck(fqk, (x, k))


@pytest.mark.parametrize("kernels", [True, False])
def test_vmap_over_ids_equals_a_loop(kernels: bool) -> None:
    w, ids, t, pos, scale, _, seed, pad = _embedding_args(torch.float32, 0.0, 2)
    batch = torch.stack([ids, ids.flip(0), ids % 3])                           # (3, 2, 4)
    with use_kernels(kernels):
        for p in (0.0, 0.3):
            f = lambda i, p=p: OPS.embedding(w, i, t, pos, scale, p, seed, pad)     # noqa: E731
            got = torch.vmap(f)(batch)
            assert torch.equal(got, torch.stack([f(i) for i in batch]))
        x = torch.randn(3, 2, 2, 4, 6)
        ang = torch.rand(4, 3, dtype=torch.float64)
        got = torch.vmap(lambda x: OPS.rope(x, ang.cos(), ang.sin(), False))(x)
        assert torch.equal(got, torch.stack([OPS.rope(xi, ang.cos(), ang.sin(), False) for xi in x]))


@pytest.mark.parametrize("kernels", [True, False])
def test_per_sample_gradients(kernels: bool) -> None:
    """functional_call + vmap + grad: one dense weight gradient per sample."""
    w, ids, t, pos, scale, p, seed, pad = _embedding_args(torch.float64, 0.2, 2)
    params = {"w": w.detach(), "t": t.detach()}

    def loss(params: dict, i: torch.Tensor) -> torch.Tensor:
        out = ops.embed(params["w"], i, params["t"], pos, scale=scale, p=p, seed=seed, padding_idx=pad)
        return (out ** 2).sum()

    batch = torch.stack([ids, ids.flip(0)])
    with use_kernels(kernels):
        per = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, batch)
        for b in range(2):                                   # eager autograd through the op itself
            leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
            ref = dict(zip(leaves, torch.autograd.grad(loss(leaves, batch[b]), list(leaves.values())), strict=True))
            for name in ("w", "t"):
                _close(per[name][b], ref[name])
            assert per["w"][b][pad].abs().max() == 0


@given(shape=st.lists(st.integers(0, 4), min_size=1, max_size=3), D=st.integers(1, 9), V=st.integers(1, 30),
       p=st.sampled_from([0.0, 0.1, 0.5]), dtype=st.sampled_from([torch.float32, torch.float64]),
       id_dtype=st.sampled_from([torch.int64, torch.int32, torch.uint8, torch.int16]), table=st.booleans(),
       seed=st.integers(0, 2**62), data=st.data())
def test_any_shape_and_dtype_kernel_equals_plain(shape, D, V, p, dtype, id_dtype, table, seed, data) -> None:
    g = torch.Generator().manual_seed(seed % 1000)
    V = min(V, 255)
    ids = torch.randint(0, V, tuple(shape), generator=g).to(id_dtype)
    w = torch.randn(V, D, generator=g, dtype=dtype)
    t = torch.randn(7, D, generator=g, dtype=dtype) if table else None
    k = data.draw(st.integers(0, len(shape)))                                 # positions: a trailing part
    pos = torch.randint(0, 7, tuple(shape[len(shape) - k:]), generator=g) if table else None
    args = (w, ids, t, pos, 1.25, p, torch.tensor(seed), -1)
    fused = OPS.embedding(*args)
    with use_kernels(False):
        plain = OPS.embedding(*args)
    assert fused.shape == (*shape, D) and torch.equal(fused, plain)


def test_the_triton_choice_takes_float32_bf16_fp16_and_never_float64():
    """CUDA float64 runs plain torch: the Triton kernels refuse it (a TypeError), so the one choice
    point must not hand it to them."""
    import tokenpos
    from tokenpos.torch.ops._dispatch import triton_kernels

    pytest.importorskip("triton")
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        assert triton_kernels(torch.zeros(1, dtype=dt)) is not None
    assert triton_kernels(torch.zeros(1, dtype=torch.float64)) is None
    assert triton_kernels(torch.zeros(1), torch.zeros(1, dtype=torch.float64)) is None
    with tokenpos.use_kernels(False):
        assert triton_kernels(torch.zeros(1)) is None


def _spy_paths(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of the calls of the embedding op's one kernel entry (``rows``), and of the in-shape fast
    calls and the validating wrapper calls of the RoPE op."""
    import importlib

    counts = {"rows": 0, "fast": 0, "wrapper": 0}
    for mod_name, names in (("tokenpos.torch.ops.embedding", (("forward_rows", "rows"),)),
                            ("tokenpos.torch.ops.rope", (("run_rope", "fast"), ("rope_apply", "wrapper")))):
        mod = importlib.import_module(mod_name)
        for name, key in names:
            fn = getattr(mod, name)

            def spy(*a, _fn=fn, _key=key, **k):  # type: ignore[no-untyped-def]
                counts[_key] += 1
                return _fn(*a, **k)

            monkeypatch.setattr(mod, name, spy)
    return counts


def test_arguments_out_of_shape_give_the_same_result(monkeypatch) -> None:
    """Non-contiguous tables, ids and positions, int32 ids, 0-d positions: the embedding op takes
    them all through its one kernel entry (which only normalises the layout); RoPE converts them
    through its wrapper, contiguous ones go straight to the core. Same values every way."""
    counts = _spy_paths(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(40, 12, generator=gen)
    T = torch.randn(9, 12, generator=gen)
    ids = torch.randint(0, 40, (3, 5), generator=gen)
    pos = torch.arange(5)
    seed = torch.zeros((), dtype=torch.int64)
    wide = torch.randn(40, 24, generator=gen)
    cases = {
        "in shape": (W, ids, T, pos, "rows"),
        "strided table": (wide[:, ::2], ids, T, pos, "rows"),
        "strided ids": (W, ids.t().contiguous().t(), T, pos, "rows"),
        "int32 ids": (W, ids.int(), T, pos, "rows"),
        "strided positions": (W, ids, T, torch.arange(10)[::2], "rows"),          # 0, 2, ..., 8
        "0-d position": (W, ids, T, torch.tensor(4), "rows"),
        "(B, L) positions": (W, ids, T, pos.expand(3, 5).contiguous(), "rows"),
    }
    for name, (w, i, t, p, path) in cases.items():
        before = dict(counts)
        got = OPS.embedding(w, i, t, p, 2.0, 0.0, seed, -1)
        assert counts[path] == before[path] + 1, name
        with use_kernels(False):
            ref = OPS.embedding(w, i, t, p, 2.0, 0.0, seed, -1)
        assert torch.equal(got, ref), name
    # RoPE: every table form the compiled pass takes (``run_rope``'s doc) goes straight to it; HF's
    # (1, L, F) tables (position_ids (1, L)) went through the copying wrapper until 2026-11-27
    q = torch.randn(2, 3, 5, 8, generator=gen)
    k = torch.randn(2, 1, 5, 8, generator=gen)
    c, s = torch.rand(2, 5, 4, generator=gen), torch.rand(2, 5, 4, generator=gen)
    table, at = torch.rand(9, 4, generator=gen), torch.tensor([[0, 3, 8, 2, 4], [1, 1, 1, 7, 5]])
    def hf_decode(x: torch.Tensor) -> torch.Tensor:                         # (B, 1, H, Dh) seen as (B, H, 1, Dh)
        return x[:, :, :1].transpose(1, 2).contiguous().transpose(1, 2)

    rope_cases = {
        "(L, F) tables": (q, k, c[0], s[0], None, "fast"),
        "(1, L, F) tables": (q, k, c[:1], s[:1], None, "fast"),
        "(B, L, F) tables": (q, k, c, s, None, "fast"),
        "(P, F) table, (B, L) positions": (q, k, table, table.flip(0), at, "fast"),
        "(P, F) table, (L,) positions": (q, k, table, table.flip(0), at[0], "fast"),
        "HF decode: one token, (1, 1, F) tables": (hf_decode(q), hf_decode(k), c[:1, :1], s[:1, :1], None, "fast"),
        "strided q": (q.transpose(1, 2).contiguous().transpose(1, 2), k, c[0], s[0], None, "wrapper"),
        "strided tables": (q, k, c[..., ::1].transpose(0, 1).contiguous().transpose(0, 1), s, None, "wrapper"),
    }
    for name, (qq, kk, cc, ss, pp, path) in rope_cases.items():
        before = dict(counts)
        got = OPS.rope_qk(qq, kk, cc, ss, False, pp)
        assert counts[path] == before[path] + 1 and counts["fast"] + counts["wrapper"] == sum(
            before[key] for key in ("fast", "wrapper")) + 1, name
        with use_kernels(False):
            ref = OPS.rope_qk(qq, kk, cc, ss, False, pp)
        for a, b in zip(got, ref, strict=True):
            _close(a, b)


@pytest.mark.parametrize("kernels", [True, False])
def test_double_backward_with_padding_idx_makes_no_host_tensor(kernels: bool, monkeypatch) -> None:
    """The backward op's own backward zeroes the padding row without ``torch.tensor`` (a host-to-device
    copy per call on CUDA); the result is the adjoint of the backward op (gradcheck in float64)."""
    w, ids, t, pos, scale, p, seed, _ = _embedding_args(torch.float64, 0.3, -1)
    g = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    made: list[object] = []
    real = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: made.append(a) or real(*a, **k))
    with use_kernels(kernels):
        fn = lambda g: OPS.embedding_backward(g, ids, pos, 9, 6, scale, p, seed, 2)  # noqa: E731
        gw, _ = fn(g)
        assert gw[2].abs().max() == 0
        (gg,) = torch.autograd.grad((gw * torch.ones_like(gw)).sum(), g, create_graph=True)
        assert not made and gg.shape == g.shape
        assert torch.autograd.gradcheck(fn, (g,))


def test_dense_token_gradient_reuses_released_memory_and_never_a_live_one() -> None:
    """The CPU backward's dense (V, D) gradient comes from released output blocks (``tokenpos._outputs``):
    a gradient that was dropped (``zero_grad(set_to_none=True)``) lends its memory to the next step, so a
    large table does not page-fault every step; a gradient still alive is never handed out again."""
    V, D = 4096, 64                                                          # 1 MiB: cached
    weight = torch.randn(V, D, requires_grad=True)
    ids = torch.randint(0, V, (3, 5), generator=torch.Generator().manual_seed(0))

    def step() -> torch.Tensor:
        with use_kernels(True):
            ops.embed(weight, ids, scale=2.0).sum().backward()
        g, weight.grad = weight.grad, None
        assert g is not None
        return g

    first = step()
    kept = first.clone()
    second = step()                                                          # first still alive
    assert second.data_ptr() != first.data_ptr()
    torch.testing.assert_close(first, kept, rtol=0, atol=0)
    torch.testing.assert_close(second, kept, rtol=0, atol=0)
    from tokenpos._config import OUTPUTS
    free = OUTPUTS.free_bytes()
    del first, second                                                        # back to the cache ...
    assert OUTPUTS.free_bytes() == free + 2 * V * D * 4
    third = step()                                                           # ... and lent again
    assert OUTPUTS.free_bytes() == free + V * D * 4
    want = torch.zeros(V, D).index_add_(0, ids.reshape(-1), torch.full((ids.numel(), D), 2.0))
    torch.testing.assert_close(third, want, rtol=0, atol=0)                 # zeroed, not stale rows
