"""numpy.module: Parameter (dense and row-sparse gradients), RowSparseGrad, Module plumbing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tokenpos.numpy as tpn
from tests.numpy.helpers import FAST
from tokenpos.numpy.module import RowSparseGrad, coalesce_rows


def make_param(V=6, D=3, dtype=np.float64):
    return tpn.Parameter(np.arange(V * D, dtype=dtype).reshape(V, D))


def test_grad_is_none_before_any_backward():
    p = make_param()
    assert p.grad is None and p.sparse_grad is None and not p.has_grad


def test_accumulate_rows_keeps_a_row_sparse_gradient_with_duplicates_summed():
    p = make_param()
    p.accumulate_rows(np.array([4, 1, 4]), np.array([[1.0, 1, 1], [2, 2, 2], [3, 3, 3]]))
    p.accumulate_rows(np.array([1, 0]), np.array([[10.0, 0, 0], [5, 5, 5]]))
    sg = p.sparse_grad
    assert isinstance(sg, RowSparseGrad)
    np.testing.assert_array_equal(sg.indices, [0, 1, 4])
    assert sg.indices.dtype == np.int64
    np.testing.assert_array_equal(sg.rows, [[5, 5, 5], [12, 2, 2], [4, 4, 4]])
    dense = np.zeros((6, 3))
    dense[[0, 1, 4]] = sg.rows
    np.testing.assert_array_equal(p.grad, dense)          # the dense view on request
    p.grad[1] *= 0.5                                      # ...which is then the gradient (edited in place)
    after = p.sparse_grad                                 # its touched rows, read from it
    np.testing.assert_array_equal(after.indices, [0, 1, 4])
    np.testing.assert_array_equal(after.rows, [[5, 5, 5], [6, 1, 1], [4, 4, 4]])
    np.testing.assert_array_equal(sg.to_dense((6, 3), np.float64), dense)
    p.accumulate_rows(np.array([2]), np.ones((1, 3)))     # more rows after the fold join them
    np.testing.assert_array_equal(p.sparse_grad.indices, [0, 1, 2, 4])
    p.grad = np.ones((6, 3))                              # a dense gradient of the user's: every row counts
    assert p.sparse_grad is None


@pytest.mark.parametrize("make_opt", [
    lambda ps: tpn.optim.Adam(ps, lr=0.1, sparse_mode="lazy"),
    lambda ps: tpn.optim.Adam(ps, lr=0.1, sparse_mode="sparse_adam"),
    lambda ps: tpn.optim.AdamW(ps, lr=0.1, weight_decay=0.1, sparse_mode="lazy"),
    lambda ps: tpn.optim.SGD(ps, lr=0.1, momentum=0.9, sparse_mode="lazy"),
])
def test_reading_the_gradient_does_not_change_a_lazy_update(make_opt) -> None:  # noqa: ANN001
    """A grad-norm log between backward and step read ``grad``, which folded the row-sparse gradient into a
    dense one, and lazy / SparseAdam updates then moved every row and decayed every moment."""
    def run(read: bool) -> np.ndarray:
        tok = tpn.TokenEmbedding(6, 2, seed=0)
        opt = make_opt(tok.parameters())
        for ids in (np.array([1]), np.array([2, 2]), np.array([1, 4])):
            tok.zero_grad()
            tok(ids)
            tok.backward(np.ones((ids.size, 2), np.float32))
            if read:
                float(np.linalg.norm(tok.weight.grad))
            opt.step()
        return tok.weight.data.copy()

    np.testing.assert_array_equal(run(read=True), run(read=False))


def test_dense_and_sparse_accumulate_together():
    p = make_param()
    p.accumulate(np.ones((6, 3)))
    p.accumulate_rows(np.array([2, 2]), np.ones((2, 3)))
    p.accumulate(np.ones((6, 3)))
    expected = np.full((6, 3), 2.0)
    expected[2] += 2.0
    np.testing.assert_array_equal(p.grad, expected)
    q = make_param()
    q.accumulate_rows(np.array([5]), np.ones((1, 3)))
    q.accumulate(np.ones((6, 3)))
    assert q.sparse_grad is None
    assert q.grad[5].tolist() == [2.0, 2.0, 2.0] and q.grad[0].tolist() == [1.0, 1.0, 1.0]


def test_gradients_are_cast_to_the_parameter_dtype():
    p = make_param(dtype=np.float32)
    p.accumulate_rows(np.array([0]), np.ones((1, 3), dtype=np.float64))
    assert p.sparse_grad.rows.dtype == np.float32
    p.accumulate(np.ones((6, 3)))
    assert p.grad.dtype == np.float32


def test_frozen_parameter_gets_no_gradient():
    p = make_param()
    p.requires_grad = False
    p.accumulate(np.ones((6, 3)))
    p.accumulate_rows(np.array([1]), np.ones((1, 3)))
    assert p.grad is None and not p.has_grad


def test_zero_grad_and_setter():
    p = make_param()
    p.accumulate_rows(np.array([1]), np.ones((1, 3)))
    p.zero_grad()
    assert p.grad is None and p.sparse_grad is None
    p.grad = np.ones((6, 3), dtype=np.float32)
    assert p.grad.dtype == np.float64 and p.grad.sum() == 18
    with pytest.raises(ValueError, match=r"grad must have shape \(6, 3\), got \(3, 6\)"):
        p.grad = np.ones((3, 6))
    p.grad = None
    assert not p.has_grad


def test_empty_row_gradient():
    p = make_param()
    p.accumulate_rows(np.zeros(0, dtype=np.int64), np.zeros((0, 3)))
    assert p.sparse_grad.indices.shape == (0,) and p.sparse_grad.rows.shape == (0, 3)
    np.testing.assert_array_equal(p.grad, np.zeros((6, 3)))


@FAST
@given(ids=st.lists(st.integers(0, 9), min_size=0, max_size=30), seed=st.integers(0, 1000))
def test_coalesce_rows_matches_add_at(ids, seed):
    ids = np.array(ids, dtype=np.int64)
    rows = np.random.default_rng(seed).standard_normal((ids.size, 4))
    c = coalesce_rows(ids, rows)
    np.testing.assert_array_equal(c.indices, np.unique(ids))
    ref = np.zeros((10, 4))
    np.add.at(ref, ids, rows)
    np.testing.assert_allclose(c.to_dense((10, 4), np.float64), ref, rtol=1e-12, atol=1e-12)


class Two(tpn.Module):
    def __init__(self):
        super().__init__()
        self.register_module("a", tpn.TokenEmbedding(5, 2, seed=0))
        self.register_module("b", tpn.LearnedPositionalEmbedding(3, 2, seed=1))

    def forward(self, ids):
        return self.a(ids) + self.b(ids.shape[-1])


def test_module_plumbing():
    m = Two()
    assert m.training and m.a.training and m.b.training, "NumPy layers default to training mode"
    assert m.eval() is m and not any(x.training for x in m.modules())
    assert m.train() is m and all(x.training for x in m.modules())
    m.train(False)
    assert not m.b.training
    assert [n for n, _ in m.named_parameters()] == ["a.weight", "b.weight"]
    m.b.weight.requires_grad = False
    assert m.parameters() == [m.a.weight], "parameters() lists only trainable ones"
    assert [n for n, _ in m.named_parameters()] == ["a.weight", "b.weight"]
    assert set(m.state_dict()) == {"a.weight", "b.weight"}, "state_dict keeps frozen parameters"
    np.testing.assert_array_equal(m(np.array([1, 2, 3])), m.forward(np.array([1, 2, 3])))
    m.a.backward(np.ones((3, 2)))
    m.zero_grad()
    assert m.a.weight.grad is None
    assert "TokenEmbedding(5, 2" in repr(m) and "LearnedPositionalEmbedding(3, 2" in repr(m)


@pytest.mark.parametrize("layer", [
    tpn.TokenEmbedding(4, 2, seed=0), tpn.LearnedPositionalEmbedding(4, 2, seed=0),
    tpn.LayerNorm(2), tpn.RMSNorm(2), tpn.TransformerEmbedding(4, 2, 4, seed=0),
])
def test_backward_before_forward_is_a_runtime_error(layer):
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(np.ones((1, 2)))


def test_attend_backward_before_attend_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="before forward"):
        tpn.TokenEmbedding(4, 2, seed=0).attend_backward(np.ones((1, 4)))
