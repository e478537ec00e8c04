"""Bad input raises the same exception type with the same text in both backends (CPU tensors)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tokenpos.tables.errors import ConfigError, PositionError, StateDictError, TokenIdError


def same_error(np_fn: Callable[[], Any], torch_fn: Callable[[], Any], cls: type[Exception]) -> str:
    with pytest.raises(cls) as np_exc:
        np_fn()
    with pytest.raises(cls) as t_exc:
        torch_fn()
    assert type(t_exc.value) is type(np_exc.value)
    assert str(t_exc.value) == str(np_exc.value)
    return str(t_exc.value)


def pair(name: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    return getattr(tpn, name)(*args, **kwargs, seed=0), getattr(tpt, name)(*args, **kwargs, seed=0)


BAD_IDS = [
    np.array([[1, 2], [3, 50]]),                  # too large
    np.array([4, -1, 2]),                        # negative: refused, never wrapped
    np.array([[1, 2], [-3, 99]]),                # first bad in C order
    np.array([1.0, 2.0], dtype=np.float32),      # float
    np.array([True, False]),                     # bool
]


@pytest.mark.parametrize("ids", BAD_IDS, ids=["high", "negative", "first", "float", "bool"])
def test_token_ids(ids: np.ndarray) -> None:
    np_layer, t_layer = pair("TokenEmbedding", 50, 4)
    msg = same_error(lambda: np_layer(ids), lambda: t_layer(torch.from_numpy(ids)), TokenIdError)
    assert "50" in msg
    te_np, te_t = pair("TransformerEmbedding", 50, 4, 8)
    same_error(lambda: te_np(ids), lambda: te_t(torch.from_numpy(ids)), TokenIdError)
    assert isinstance(ValueError(), Exception) and issubclass(TokenIdError, IndexError)


def test_token_id_message_text() -> None:
    _, t_layer = pair("TokenEmbedding", 50257, 4)
    with pytest.raises(TokenIdError, match=r"token id 50257 at index \(1, 3\) is out of range \[0, 50257\)"):
        t_layer(torch.tensor([[0, 1, 2, 3], [4, 5, 6, 50257]]))


@pytest.mark.parametrize("pos", [np.array([[1, 8]]), np.array([3, -2]), np.array([0.5])], ids=["high", "neg", "float"])
def test_learned_positions(pos: np.ndarray) -> None:
    np_layer, t_layer = pair("LearnedPositionalEmbedding", 8, 4)
    same_error(lambda: np_layer(pos), lambda: t_layer(torch.from_numpy(pos)), PositionError)


def test_seq_len_too_long_and_negative() -> None:
    np_layer, t_layer = pair("LearnedPositionalEmbedding", 8, 4)
    same_error(lambda: np_layer(9), lambda: t_layer(9), PositionError)
    same_error(lambda: np_layer(-1), lambda: t_layer(-1), ConfigError)
    s_np, s_t = tpn.SinusoidalPositionalEncoding(8, 4), tpt.SinusoidalPositionalEncoding(8, 4)
    same_error(lambda: s_np(np.array([-1])), lambda: s_t(torch.tensor([-1])), PositionError)


IDS = np.array([[1, 2, 3], [4, 5, 6]])

TE_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], type[Exception]]] = {
    "ids_3d": ({}, {"ids": IDS[None]}, ConfigError),
    "positions_shape": ({}, {"positions": np.array([0, 1])}, ConfigError),
    "positions_negative": ({}, {"positions": np.array([0, -1, 2])}, PositionError),
    "positions_beyond_max": ({}, {"positions": np.array([0, 1, 8])}, PositionError),
    "start_pos_beyond_max": ({}, {"start_pos": 6}, PositionError),
    "start_pos_negative": ({}, {"start_pos": -1}, ConfigError),
    "start_pos_float": ({}, {"start_pos": 1.5}, ConfigError),
    "token_type_out_of_range": ({"num_token_types": 2}, {"token_type_ids": IDS % 3}, TokenIdError),
    "token_type_shape": ({"num_token_types": 2}, {"token_type_ids": np.zeros(3, np.int64)}, ConfigError),
    "token_type_without_table": ({}, {"token_type_ids": np.zeros_like(IDS)}, ConfigError),
    "roberta_start_pos_beyond": ({"padding_idx": 0, "position_ids": "padding"}, {"start_pos": 5}, PositionError),
    # RoBERTa's positions run to padding_idx + start_pos + L: both backends check that span
    "roberta_start_pos_overflow": ({"padding_idx": 9, "position_ids": "padding", "positional": "sinusoidal"},
                                   {"start_pos": 2**63 - 1 - 5}, PositionError),
    "roberta_start_pos_overflow_by_one": ({"padding_idx": 1, "position_ids": "padding", "positional": "sinusoidal"},
                                          {"start_pos": 2**63 - 1 - 4}, PositionError),
    "start_pos_with_positions": ({}, {"positions": np.array([0, 1, 2]), "start_pos": 3}, ConfigError),
    "start_pos_np_with_positions": ({}, {"positions": np.array([0, 1, 2]), "start_pos": np.int64(3)}, ConfigError),
    "start_pos_none_with_positions": ({}, {"positions": np.array([0, 1, 2]), "start_pos": None}, ConfigError),
    "roberta_start_pos_with_positions": ({"padding_idx": 0, "position_ids": "padding"},
                                         {"positions": np.array([[1, 2, 3], [1, 2, 3]]), "start_pos": 2}, ConfigError),
}


@pytest.mark.parametrize("case", sorted(TE_CASES))
def test_transformer_embedding_inputs(case: str) -> None:
    ctor, call, cls = TE_CASES[case]
    np_layer, t_layer = pair("TransformerEmbedding", 10, 4, 8, **ctor)
    call = {"ids": IDS, **call}
    t_call = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in call.items()}
    ids, t_ids = call.pop("ids"), t_call.pop("ids")
    positions, t_positions = call.pop("positions", None), t_call.pop("positions", None)
    same_error(lambda: np_layer(ids, positions, **call), lambda: t_layer(t_ids, t_positions, **t_call), cls)


CTOR_CASES: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("TokenEmbedding", (0, 4), {}),
    ("TokenEmbedding", (10, 4), {"padding_idx": 10}),
    ("TokenEmbedding", (10, 4), {"padding_idx": -1}),
    ("TokenEmbedding", (10, 4), {"init": "orthogonal"}),
    ("LearnedPositionalEmbedding", (8, 0), {}),
    ("SinusoidalPositionalEncoding", (8, 4), {"base": 1.0}),
    ("SinusoidalPositionalEncoding", (8, 4), {"layout": "spiral"}),
    ("TransformerEmbedding", (10, 4), {"positional": "fourier"}),
    ("TransformerEmbedding", (10, 4), {"dropout": 1.0}),
    ("TransformerEmbedding", (10, 4), {"norm": "batchnorm"}),
    ("TransformerEmbedding", (10, 4), {"position_ids": "padding"}),
    ("TransformerEmbedding", (10, 4), {"num_token_types": -1}),
    ("LayerNorm", (4,), {"eps": 0.0}),
]


@pytest.mark.parametrize("name,args,kwargs", CTOR_CASES)
def test_constructor_arguments(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    same_error(lambda: getattr(tpn, name)(*args, **kwargs), lambda: getattr(tpt, name)(*args, **kwargs),
               ConfigError)


def test_positional_choices_are_listed() -> None:
    with pytest.raises(ValueError, match="'learned'.*'none'.*'sinusoidal'"):
        tpt.TransformerEmbedding(10, 4, positional="fourier")


def test_state_dict_errors_match() -> None:
    np_layer, t_layer = pair("TransformerEmbedding", 10, 4, 8)
    missing = {"token.weight": np.zeros((10, 4), np.float32)}
    same_error(lambda: np_layer.load_state_dict(missing), lambda: t_layer.load_state_dict(missing), StateDictError)
    shape = {"token.weight": np.zeros((11, 4), np.float32), "position.weight": np.zeros((8, 4), np.float32)}
    same_error(lambda: np_layer.load_state_dict(shape), lambda: t_layer.load_state_dict(shape), StateDictError)
    before = t_layer.token.weight.detach().clone()
    with pytest.raises(StateDictError):
        t_layer.load_state_dict(shape)
    assert torch.equal(t_layer.token.weight, before)        # nothing written


def test_attend_and_resize_errors() -> None:
    np_layer, t_layer = pair("TokenEmbedding", 10, 4)
    h = np.zeros((2, 5), np.float32)
    same_error(lambda: np_layer.attend(h), lambda: t_layer.attend(torch.from_numpy(h)), ConfigError)
    same_error(lambda: np_layer.resize(5), lambda: t_layer.resize(5), ConfigError)
    p_np, p_t = pair("TokenEmbedding", 10, 4, padding_idx=8)
    same_error(lambda: p_np.resize(5, allow_shrink=True), lambda: p_t.resize(5, allow_shrink=True), ConfigError)


def test_failed_call_changes_nothing() -> None:
    _, t_layer = pair("TransformerEmbedding", 10, 4, 8, dropout=0.1)
    state = {k: v.clone() for k, v in t_layer.state_dict().items()}
    gen_state = torch.random.get_rng_state()
    with pytest.raises(TokenIdError):
        t_layer(torch.tensor([[1, 2, 10]]))
    assert torch.equal(torch.random.get_rng_state(), gen_state)   # no dropout seed drawn
    assert all(torch.equal(v, t_layer.state_dict()[k]) for k, v in state.items())


def test_device_checks_flag() -> None:
    assert tpt.device_checks_enabled() is False
    with pytest.raises(TypeError):
        tpt.set_device_checks(1)  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_host_reads_are_opt_in_and_dtype_checks_always_on() -> None:
    layer = tpt.TokenEmbedding(10, 4, device="cuda", seed=0)
    tpt.set_device_checks(True)
    try:
        with pytest.raises(TokenIdError, match="token id 10 at index"):
            layer(torch.tensor([1, 10], device="cuda"))
    finally:
        tpt.set_device_checks(False)
    with pytest.raises(TokenIdError, match="must be integers"):   # dtype checks are always on
        layer(torch.tensor([1.0], device="cuda"))


# ---------------------------------------------------------------------------------------------- odd ids


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_wide_unsigned_id_tensors_are_accepted_and_range_checked_as_numpy_does(dtype: torch.dtype) -> None:
    np_dtype = {torch.uint16: np.uint16, torch.uint32: np.uint32, torch.uint64: np.uint64}[dtype]
    for name, args in (("TokenEmbedding", (50, 4)), ("TransformerEmbedding", (50, 4, 8))):
        np_layer, t_layer = pair(name, *args)
        ids = np.array([[1, 2, 49]], dtype=np_dtype)
        torch.testing.assert_close(t_layer(torch.from_numpy(ids)), t_layer(torch.from_numpy(ids.astype(np.int64))))
        np.testing.assert_allclose(t_layer(torch.from_numpy(ids)).detach().numpy(), np_layer(ids), rtol=1e-6)
        bad = np.array([[1, 2**16 - 1]], dtype=np_dtype)
        same_error(lambda: np_layer(bad), lambda: t_layer(torch.from_numpy(bad)), TokenIdError)  # noqa: B023


def _nested_ids() -> torch.Tensor:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                      # "nested tensors are a prototype"
        return torch.nested.nested_tensor([torch.tensor([1, 2]), torch.tensor([3])])


@pytest.mark.parametrize("make", [lambda: torch.tensor([[1, 2], [0, 3]]).to_sparse(), _nested_ids,
                                  lambda: torch.tensor([[1, 2], [0, 3]]).to_sparse_csr()],
                         ids=["sparse_coo", "nested", "sparse_csr"])
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_nested_and_sparse_id_tensors_are_token_id_errors(make: Callable[[], torch.Tensor]) -> None:
    for name, args in (("TokenEmbedding", (50, 4)), ("TransformerEmbedding", (50, 4, 8))):
        layer = getattr(tpt, name)(*args, seed=0)
        with pytest.raises(TokenIdError, match=r"token ids must be a dense \(strided\) tensor, got a \w+ tensor"):
            layer(make())
    with pytest.raises(PositionError, match=r"positions must be a dense \(strided\) tensor"):
        tpt.LearnedPositionalEmbedding(8, 4, seed=0)(torch.tensor([1, 2]).to_sparse())


@pytest.mark.parametrize("dtype", ["m8[s]", "M8[D]", object])
def test_timedelta_datetime_and_object_ids_are_refused_in_both_backends(dtype: Any) -> None:
    ids = np.array([1, 2]).astype(dtype)
    np_layer, t_layer = pair("TokenEmbedding", 50, 4)
    same_error(lambda: np_layer(ids), lambda: t_layer(ids), TokenIdError)


def test_start_pos_near_int64_max_is_a_position_error_not_an_overflow() -> None:
    for positional in ("sinusoidal", "rope", "none"):
        layer = tpt.TransformerEmbedding(10, 4, 8, positional=positional, num_heads=1, seed=0)
        with pytest.raises(PositionError, match="overflows int64"):
            layer(torch.tensor([[1, 2, 3]]), start_pos=2**63 - 2)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_scale_must_be_a_bool_in_both_backends(value: Any) -> None:
    same_error(lambda: tpn.TokenEmbedding(10, 4, scale=value), lambda: tpt.TokenEmbedding(10, 4, scale=value),
               ConfigError)
    same_error(lambda: tpn.TransformerEmbedding(10, 4, 8, scale=value),
               lambda: tpt.TransformerEmbedding(10, 4, 8, scale=value), ConfigError)


@pytest.mark.parametrize("dtype", [np.int64, np.bool_])
def test_integer_and_bool_float_inputs_are_refused_in_both_backends(dtype: Any) -> None:
    from tokenpos.tables.errors import DtypeError

    h = np.ones((2, 4)).astype(dtype)
    np_layer, t_layer = pair("TokenEmbedding", 10, 4)
    same_error(lambda: np_layer.attend(h), lambda: t_layer.attend(torch.from_numpy(h)), DtypeError)
    for norm in ("LayerNorm", "RMSNorm"):
        n_np, n_t = getattr(tpn, norm)(4), getattr(tpt, norm)(4)
        msg = same_error(lambda: n_np(h), lambda: n_t(torch.from_numpy(h)), DtypeError)  # noqa: B023
        assert msg.startswith("x must be a floating-point array")


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bad_ids_give_one_error_whichever_pass_checks_them(kernels: bool, dropout: float, dtype: torch.dtype,
                                                           monkeypatch) -> None:
    """The layer checks the id values in exactly one pass at its entry, on every path (kernels on or
    off, with dropout too: the seed is drawn after the check). Same error, same text, and a failed
    call changes no state."""
    import tokenpos
    import tokenpos.torch._checks as checks

    passes: list[int] = []
    real = checks._outside
    monkeypatch.setattr(checks, "_outside", lambda *a: passes.append(1) or real(*a))
    ids = np.array([[1, 2], [3, 50]])
    with tokenpos.use_kernels(kernels):
        np_layer = tpn.TransformerEmbedding(50, 4, 8, dropout=dropout, seed=0)
        t_layer = tpt.TransformerEmbedding(50, 4, 8, dropout=dropout, seed=0, dtype=dtype)
        state = torch.random.get_rng_state()
        same_error(lambda: np_layer(ids), lambda: t_layer(torch.from_numpy(ids)), TokenIdError)
        assert torch.equal(torch.random.get_rng_state(), state)
        assert len(passes) == 1
        good = t_layer(torch.from_numpy(ids % 50))                        # and good ids still go through
        assert good.shape == (2, 2, 4) and good.dtype == dtype


@pytest.mark.parametrize("kernels", [True, False])
def test_the_op_refuses_bad_ids_and_positions_whoever_calls_it(kernels: bool) -> None:
    """``torch.ops.tokenpos.embedding`` called directly (no layer checks): never a read outside a table."""
    import tokenpos

    w, t = torch.ones(4, 3), torch.ones(2, 3)
    seed = torch.zeros((), dtype=torch.int64)
    cases = [(torch.tensor([0, 4]), torch.tensor([0, 1]), TokenIdError),
             (torch.tensor([0, 1]), torch.tensor([0, 2]), PositionError),
             (torch.tensor([0, 1]), torch.tensor([-1, 0]), PositionError)]
    with tokenpos.use_kernels(kernels):
        for ids, pos, cls in cases:
            with pytest.raises(cls if kernels else IndexError):          # plain torch: F.embedding's IndexError
                torch.ops.tokenpos.embedding(w, ids, t, pos, 1.0, 0.0, seed, -1)
