"""The torch tied cross-entropy (issue 33): ``tokenpos::tied_cross_entropy`` against ``F.cross_entropy(h @ W.T)``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tokenpos
import tokenpos.torch as tpt
from tests.tolerances import TOL
from tokenpos.tables.errors import ConfigError, DtypeError, TokenIdError

CASES = [  # (reduction, label_smoothing, softcap)
    ("mean", 0.0, None), ("sum", 0.0, None), ("none", 0.0, None),
    ("mean", 0.1, None), ("sum", 0.2, 3.0), ("none", 0.1, 2.0), ("mean", 0.0, 1.5),
]


def _inputs(V: int, shape: tuple[int, ...], D: int = 6, dtype: torch.dtype = torch.float64, seed: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn((*shape, D), generator=g, dtype=dtype)
    w = 0.5 * torch.randn((V, D), generator=g, dtype=dtype)
    t = torch.randint(0, V, shape, generator=g)
    t.view(-1)[1] = -100
    return h, w, t


def _reference(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, grad: torch.Tensor, reduction: str, eps: float,
               cap: float | None) -> tuple[torch.Tensor, ...]:
    """F.cross_entropy of the materialised logits, in float64, and its gradients."""
    h = h.detach().double().requires_grad_()
    w = w.detach().double().requires_grad_()
    z = h @ w.T
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    loss = F.cross_entropy(z.reshape(-1, z.shape[-1]), t.reshape(-1), reduction=reduction, label_smoothing=eps)
    loss = loss.reshape(t.shape) if reduction == "none" else loss
    loss.backward(grad.double())
    return loss.detach(), h.grad, w.grad


def _run(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, grad: torch.Tensor,
         **kw: object) -> tuple[torch.Tensor, ...]:
    h = h.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    loss = tpt.tied_cross_entropy(h, w, t, **kw)  # type: ignore[arg-type]
    loss.backward(grad)
    return loss.detach(), h.grad, w.grad  # type: ignore[return-value]


def _eager(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, grad: torch.Tensor, reduction: str, eps: float,
           cap: float | None) -> tuple[torch.Tensor, ...]:
    """F.cross_entropy of the materialised logits in the inputs' dtype (the path the tied loss replaces)."""
    h = h.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    z = h @ w.T
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    loss = F.cross_entropy(z.reshape(-1, z.shape[-1]), t.reshape(-1), reduction=reduction, label_smoothing=eps)
    (loss.reshape(t.shape) if reduction == "none" else loss).backward(grad)
    return loss.detach().reshape(t.shape) if reduction == "none" else loss.detach(), h.grad, w.grad  # type: ignore


@pytest.mark.parametrize("V", [1003, 50257])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_loss_and_gradients_equal_f_cross_entropy_of_the_logits(V: int, case: tuple, dtype: torch.dtype) -> None:
    """float64: equal to 1e-10 (blocks of 2 tokens). float32 (the default block): within parity.f32 of the float64
    truth beyond the eager float32 path's own error (at V = 50257 a float32 sum over V columns alone errs ~1e-5)."""
    reduction, eps, cap = case
    h, w, t = _inputs(V, (2, 3) if V > 2000 else (3, 5), D=6 if dtype == torch.float64 else 16, dtype=dtype)
    grad = torch.rand(t.shape if reduction == "none" else (), dtype=dtype, generator=torch.Generator().manual_seed(1))
    got = _run(h, w, t, grad, reduction=reduction, label_smoothing=eps, softcap=cap,
               chunk_size=2 if dtype == torch.float64 else None)
    want = _reference(h, w, t, grad, reduction, eps, cap)
    assert got[0].dtype == got[1].dtype == got[2].dtype == dtype
    if dtype == torch.float64:
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
        return
    for a, e, b in zip(got, _eager(h, w, t, grad, reduction, eps, cap), want, strict=True):
        eager_err = (e.double() - b).abs().max()
        assert (a.double() - b).abs().max() <= eager_err + TOL["parity.f32"]["scale"] * b.abs().max()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_an_all_ignored_batch_has_loss_zero_and_gradient_zero(reduction: str) -> None:
    h, w, _ = _inputs(1003, (3, 4))
    t = torch.full((3, 4), -100)
    loss, dh, dw = _run(h, w, t, torch.ones(t.shape if reduction == "none" else ()), reduction=reduction,
                        label_smoothing=0.1, softcap=2.0)
    assert not loss.any() and not dh.any() and not dw.any()


def test_a_repeat_is_bit_identical_and_chunk_sizes_agree() -> None:
    h, w, t = _inputs(1003, (5, 7), dtype=torch.float32, D=16)
    one = torch.tensor(1.0)
    base = _run(h, w, t, one, label_smoothing=0.1, softcap=4.0, chunk_size=3)
    assert all(torch.equal(a, b) for a, b in zip(base, _run(h, w, t, one, label_smoothing=0.1, softcap=4.0,
                                                            chunk_size=3), strict=True))
    for chunk in (1, 35, None):
        for a, b in zip(_run(h, w, t, one, label_smoothing=0.1, softcap=4.0, chunk_size=chunk), base, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_layer_loss_is_the_tied_loss_of_its_table() -> None:
    layer = tpt.TokenEmbedding(50, 8, dtype=torch.float64, seed=0, padding_idx=0)
    h, _, t = _inputs(50, (2, 3), D=8)
    h.requires_grad_()
    loss = layer.loss(h, t, label_smoothing=0.1, softcap=3.0)
    loss.backward()
    ref = _reference(h, layer.weight, t, torch.tensor(1.0), "mean", 0.1, 3.0)
    torch.testing.assert_close(loss, ref[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(h.grad, ref[1], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(layer.weight.grad, ref[2], rtol=1e-10, atol=1e-12)
    with pytest.raises(ConfigError, match="h must have last dimension 8"):
        layer.loss(torch.ones(2, 3), t[:, :2])


@pytest.mark.parametrize(("targets", "match"), [
    (torch.tensor([[1, 5]]), r"target 5 at index \(0, 1\) is out of range \[0, 5\) and is not ignore_index=-100"),
    (torch.tensor([[-1, 0]]), r"target -1 at index \(0, 0\) is out of range"),
    (torch.tensor([[0.0, 1.0]]), "targets must be integers, got dtype float32"),
    ([[0, 7]], r"target 7 at index \(0, 1\)"),
])
def test_a_bad_target_raises_token_id_error_before_any_change(targets: object, match: str) -> None:
    layer = tpt.TokenEmbedding(5, 3, dtype=torch.float64, seed=0)
    h = torch.ones(1, 2, 3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(TokenIdError, match=match):
        layer.loss(h, targets)
    with pytest.raises(TokenIdError, match=match):
        torch.ops.tokenpos.tied_cross_entropy(h, layer.weight, torch.as_tensor(targets), -100, 0.0, "mean", None, None,
                                              True)
    assert layer.weight.grad is None and h.grad is None


def test_mixed_dtypes_devices_and_bad_options_raise_typed_errors() -> None:
    h, w, t = torch.ones(2, 4), torch.ones(7, 4, dtype=torch.float64), torch.tensor([1, 2])
    with pytest.raises(DtypeError, match="h and weight must have the same dtype, got h float32 and weight float64"):
        tpt.tied_cross_entropy(h, w, t)
    with pytest.raises(DtypeError, match="h and weight must have the same dtype"):
        torch.ops.tokenpos.tied_cross_entropy(h, w, t, -100, 0.0, "mean", None, None, False)
    with pytest.raises(ConfigError, match='with_grad=True needs reduction "mean" or "sum"'):
        torch.ops.tokenpos.tied_cross_entropy(h, h, t, -100, 0.0, "none", None, None, True)
    with pytest.raises(ConfigError, match="h and weight must have the same device, got h meta and weight cpu"):
        tpt.tied_cross_entropy(h.double().to("meta"), w, t)
    with pytest.raises(ConfigError, match=r"targets must have shape \(2,\)"):
        tpt.tied_cross_entropy(h.double(), w, torch.tensor([1]))
    with pytest.raises(ConfigError, match="softcap must be > 0"):
        tpt.tied_cross_entropy(h.double(), w, t, softcap=-1.0)
    with pytest.raises(ConfigError, match="reduction"):
        tpt.tied_cross_entropy(h.double(), w, t, reduction="avg")


def test_bfloat16_inputs_compute_in_float32() -> None:
    h, w, t = _inputs(1003, (3, 4), D=16, dtype=torch.bfloat16)
    got = _run(h, w, t, torch.tensor(1.0), label_smoothing=0.1)
    want = _reference(h, w, t, torch.tensor(1.0), "mean", 0.1, None)
    assert got[0].dtype == torch.float32 and got[1].dtype == got[2].dtype == torch.bfloat16
    for a, b in zip(got, want, strict=True):
        assert (a.double() - b).abs().max() <= 2.0 ** -7 * b.abs().max()


def test_torch_compile_keeps_the_op_in_the_graph() -> None:
    h, w, t = _inputs(50, (2, 3), D=8)
    compiled = torch.compile(lambda h, w: tpt.tied_cross_entropy(h, w, t, softcap=2.0), fullgraph=True,
                             backend="eager")
    torch.testing.assert_close(compiled(h, w), tpt.tied_cross_entropy(h, w, t, softcap=2.0), rtol=0, atol=0)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_gradients_from_the_forward_equal_the_recomputed_ones(reduction: str) -> None:
    """with_grad=True (the forward's own blocks, what the public function uses when a gradient is wanted) and
    with_grad=False (the backward op recomputes the blocks from lse) give the same gradients."""
    h, w, t = _inputs(1003, (3, 5))
    grads = []
    for with_grad in (True, False):
        a, b = h.clone().requires_grad_(), w.clone().requires_grad_()
        loss = torch.ops.tokenpos.tied_cross_entropy(a, b, t, -100, 0.1, reduction, 2.0, 4, with_grad)[0]
        loss.backward(torch.tensor(0.7, dtype=torch.float64))
        grads.append((loss.detach(), a.grad, b.grad))
    for x, y in zip(*grads, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-14)
    ref = _reference(h, w, t, torch.tensor(0.7, dtype=torch.float64), reduction, 0.1, 2.0)
    for x, y in zip(grads[0], ref, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_on_a_device_no_host_sync_and_a_bad_target_fails_a_device_assert(reduction: str) -> None:
    """Fake CUDA (tests/torch/fake_cuda.py): forward + backward read nothing on the host and equal the CPU (the
    Triton block kernel, interpreted, against the numba one: to fp32 tolerance); a bad target fails the
    device-side assert (no TokenIdError: the value is never read)."""
    from tests.torch.fake_cuda import cpu_of, no_host_sync, to_fake_cuda

    h, w, t = _inputs(50, (2, 3), D=8, dtype=torch.float32)
    h.requires_grad_()
    w.requires_grad_()
    grad = torch.ones(t.shape if reduction == "none" else ())
    cpu = _run(h, w, t, grad, reduction=reduction, label_smoothing=0.1, softcap=2.0, chunk_size=4)
    fh, fw, ft, fg = to_fake_cuda(h), to_fake_cuda(w), to_fake_cuda(t), to_fake_cuda(grad)
    with no_host_sync():
        loss = tpt.tied_cross_entropy(fh, fw, ft, reduction=reduction, label_smoothing=0.1, softcap=2.0,
                                      chunk_size=4)
        loss.backward(fg)
    for a, b in zip((loss, fh.grad, fw.grad), cpu, strict=True):
        assert a is not None and a.device.type == "cuda"
        torch.testing.assert_close(cpu_of(a.detach()), b, **TOL["triton.cross_entropy"])
    bad = t.clone()
    bad[0, 0] = 50
    with no_host_sync(), pytest.raises(RuntimeError, match="targets on cuda:0 out of range"):
        tpt.tied_cross_entropy(to_fake_cuda(h), to_fake_cuda(w), to_fake_cuda(bad), reduction=reduction)


@pytest.mark.slow  # three backward passes of the tied loss
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_a_second_backward_through_the_same_graph_gives_the_same_gradients(reduction: str) -> None:
    """The eager entry hands the forward's gradients over, scaled in place (no second (V, D) table); a second
    backward (retain_graph, gradcheck's reentrancy check) makes them again the forward's way: the same bits, never
    grad**2. It used to fail autograd's saved-tensor version check, then to differ in the last bits (issue 48)."""
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        h, w, t = _inputs(50, (2, 3), D=8)
        h, w = h.to(dtype).requires_grad_(), w.to(dtype).requires_grad_()
        loss = tpt.tied_cross_entropy(h, w, t, reduction=reduction).sum()
        first = torch.autograd.grad(loss * 2.0, (h, w), retain_graph=True)
        again = torch.autograd.grad(loss * 2.0, (h, w))
        for a, b in zip(first, again, strict=True):
            assert torch.equal(a, b), (dtype, (a - b).abs().max())
    h, w, t = _inputs(50, (2, 3), D=8)
    assert torch.autograd.gradcheck(lambda x, y: tpt.tied_cross_entropy(x, y, t, reduction=reduction),
                                    (h.detach().requires_grad_(), w.detach().requires_grad_()))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "op"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_a_second_derivative_raises_instead_of_being_zero(reduction: str, compiled: bool) -> None:
    """``create_graph=True`` then a gradient penalty: the first-order gradient had no graph, so the penalty's
    gradient was silently 0 ("mean") or an internal mm(out=) error ("none")."""
    h, w, t = _inputs(50, (2, 3), D=8)
    h.requires_grad_()
    w.requires_grad_()
    if compiled:   # the op's own autograd (what torch.compile traces)
        loss = torch.ops.tokenpos.tied_cross_entropy(h, w, t, -100, 0.0, reduction, None, None, reduction != "none")[0]
    else:
        loss = tpt.tied_cross_entropy(h, w, t, reduction=reduction)
    g, = torch.autograd.grad(loss.sum(), h, create_graph=True)
    with pytest.raises(RuntimeError, match="tied_cross_entropy has no second derivative"):
        ((g ** 2).sum() + 0 * h.sum()).backward()
    h.grad = None
    tpt.tied_cross_entropy(h, w, t, reduction=reduction).sum().backward()
    assert h.grad is not None and h.grad.grad_fn is None                  # a plain backward builds no graph


def test_fp16_gradients_survive_a_grad_scaler() -> None:
    """fp16 with GradScaler: the gradients were kept at d loss = 1 in fp16 and scaled in fp16, where the default
    scale 2**16 is inf (every step skipped) and small gradients were flushed to 0 before the scale could save
    them. Now they equal F.cross_entropy's (fp32 logits) and the step is taken."""
    gen = torch.Generator().manual_seed(0)
    V, D, N = 64, 32, 512
    w32 = torch.randn(V, D, generator=gen) * 0.02
    h = torch.randn(N, D, generator=gen).half()
    t = torch.randint(0, V, (N,), generator=gen)
    grads = []
    for fn in (lambda w: tpt.tied_cross_entropy(h, w, t), lambda w: F.cross_entropy((h @ w.T).float(), t)):
        w = w32.half().requires_grad_()
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(fn(w)).backward()
        assert torch.isfinite(w.grad).all()
        grads.append(w.grad.float() / scaler.get_scale())
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=2e-3 * float(grads[1].abs().max()))
    assert (grads[0] == 0).sum() <= (grads[1] == 0).sum()                  # no more flushed to 0 than the reference


def test_torch_func_transforms_are_refused_with_a_typed_error() -> None:
    h, w, t = _inputs(50, (2, 3), D=8)
    with pytest.raises(ConfigError, match="does not run under torch.func transforms"):
        torch.func.grad(lambda x: tpt.tied_cross_entropy(x, w, t))(h)


@pytest.mark.parametrize("case", CASES)
def test_the_triton_block_kernel_equals_the_plain_torch_path(case: tuple) -> None:
    """On (fake) CUDA, the Triton block kernel (interpreted) and plain torch ops on the same device (kernels off,
    the reference): float32 to the Triton tolerance, the forward's gradients (mean / sum) and the recomputing
    backward ("none"), ignored targets, several column blocks. The CPU has no block kernel (issue 33)."""
    from tests.torch.fake_cuda import cpu_of, no_host_sync, to_fake_cuda
    from tokenpos.torch.ops.tied_loss_blocks import block_kernel

    reduction, eps, cap = case
    h, w, t = _inputs(2600, (4, 9), dtype=torch.float32)
    grad = torch.rand(t.shape if reduction == "none" else ())
    kw = {"reduction": reduction, "label_smoothing": eps, "softcap": cap, "chunk_size": 7}
    runs = []
    for kernels in (True, False):
        fh, fw = to_fake_cuda(h.requires_grad_()), to_fake_cuda(w.requires_grad_())
        with tokenpos.use_kernels(kernels), no_host_sync():
            assert (block_kernel(fh) is not None) == kernels                  # two paths, not one twice
            loss = tpt.tied_cross_entropy(fh, fw, to_fake_cuda(t), **kw)  # type: ignore[arg-type]
            loss.backward(to_fake_cuda(grad))
        runs.append([cpu_of(x) for x in (loss.detach(), fh.grad, fw.grad)])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, **TOL["triton.cross_entropy"])


@pytest.mark.slow  # repeated runs
def test_bit_identical_run_to_run() -> None:
    """Determinism (issue 33) on the CPU: loss, dh and dweight bit for bit on every run (the eager entry and the op
    with its recomputing backward; blocks in token order, dweight added block after block)."""
    h, w, t = _inputs(3000, (8, 40), D=16, dtype=torch.float32)
    kw = {"label_smoothing": 0.1, "softcap": 4.0, "chunk_size": 64}

    def op() -> tuple[torch.Tensor, ...]:
        a, b = h.clone().requires_grad_(), w.clone().requires_grad_()
        loss = torch.ops.tokenpos.tied_cross_entropy(a, b, t, -100, 0.1, "mean", 4.0, 64, False)[0]
        loss.backward()
        return loss.detach(), a.grad, b.grad  # type: ignore[return-value]

    one = torch.tensor(1.0)
    for step in (lambda: _run(h, w, t, one, **kw), op):
        runs = [step() for _ in range(3)]
        for r in runs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(r, runs[0], strict=True))
