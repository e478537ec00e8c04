"""NumPy <-> torch parity of every layer: outputs, parameter gradients and input gradients.

State crosses the backends through ``state_dict`` in both directions. One line per case.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.numpy.helpers import FAST, id_arrays
from tests.parity.helpers import assert_parity
from tokenpos.tables.formulas.dropout import SEED_MASK

RNG = np.random.default_rng(1234)
IDS = RNG.integers(0, 50, size=(3, 7))
IDS_PAD = np.array([[1, 5, 9, 0, 0], [0, 3, 3, 3, 7]])          # 0 is padding
TT = RNG.integers(0, 2, size=(3, 7))
POS = np.array([0, 2, 4, 6, 8, 10, 12])
X = RNG.standard_normal((2, 5, 8)).astype(np.float32)
X64 = RNG.standard_normal((2, 5, 8))

CASES = {
    "token":              ("TokenEmbedding", (50, 8), {}, (IDS,), {}),
    "token_pad_scale":    ("TokenEmbedding", (50, 8), {"padding_idx": 0, "scale": True}, (IDS_PAD,), {}),
    "token_1d_int32":     ("TokenEmbedding", (50, 8), {}, (IDS[0].astype(np.int32),), {}),
    "token_f64":          ("TokenEmbedding", (50, 8), {"dtype": np.float64}, (IDS,), {}),
    "learned_len":        ("LearnedPositionalEmbedding", (16, 8), {}, (7,), {}),
    "learned_pos":        ("LearnedPositionalEmbedding", (16, 8), {}, (np.array([[3, 3, 15], [0, 1, 3]]),), {}),
    "sinusoidal_len":     ("SinusoidalPositionalEncoding", (16, 7), {}, (9,), {}),
    "sinusoidal_beyond":  ("SinusoidalPositionalEncoding", (8, 6), {"layout": "half"}, (np.array([1, 30, 7]),), {}),
    "layernorm":          ("LayerNorm", (8,), {"eps": 1e-5}, (X,), {}),
    "layernorm_f64":      ("LayerNorm", (8,), {"dtype": np.float64}, (X64,), {}),
    "rmsnorm":            ("RMSNorm", (8,), {}, (X,), {}),
    "te_learned":         ("TransformerEmbedding", (50, 8, 16), {}, (IDS,), {}),
    "te_start_pos":       ("TransformerEmbedding", (50, 8, 16), {"scale": True}, (IDS,), {"start_pos": 9}),
    "te_positions":       ("TransformerEmbedding", (50, 8, 16), {}, (IDS,), {"positions": POS}),
    "te_sinusoidal":      ("TransformerEmbedding", (50, 8, 16), {"positional": "sinusoidal"}, (IDS[0],), {}),
    "te_none":            ("TransformerEmbedding", (50, 8, 16), {"positional": None}, (IDS,), {}),
    "te_bert":            ("TransformerEmbedding", (50, 8, 16), {"num_token_types": 2, "norm": "layernorm",
                                                                 "padding_idx": 0}, (IDS,), {"token_type_ids": TT}),
    "te_bert_no_tt":      ("TransformerEmbedding", (50, 8, 16), {"num_token_types": 2, "norm": "layernorm"},
                           (IDS,), {}),
    "te_rmsnorm":         ("TransformerEmbedding", (50, 8, 16), {"norm": "rmsnorm", "norm_eps": 1e-6}, (IDS,), {}),
    "te_roberta":         ("TransformerEmbedding", (50, 8, 16), {"padding_idx": 0, "position_ids": "padding",
                                                                 "norm": "layernorm"}, (IDS_PAD,), {"start_pos": 2}),
    "te_rope":            ("TransformerEmbedding", (50, 8, 16), {"positional": "rope", "num_heads": 2}, (IDS,), {}),
    "te_alibi":           ("TransformerEmbedding", (50, 8, 16), {"positional": "alibi", "num_heads": 2}, (IDS,), {}),
    "te_t5":              ("TransformerEmbedding", (50, 8, 16), {"positional": "t5", "num_heads": 2}, (IDS,), {}),
    "te_f64":             ("TransformerEmbedding", (50, 8, 16), {"dtype": np.float64, "norm": "layernorm"},
                           (IDS,), {}),
    # dtype=None is the default in both backends: float32 (NumPy read None as float64, so the states did not load)
    "token_dtype_none":   ("TokenEmbedding", (50, 8), {"dtype": None}, (IDS,), {}),
    "te_dtype_none":      ("TransformerEmbedding", (50, 8, 16), {"dtype": None, "num_token_types": 2,
                                                                 "norm": "layernorm"}, (IDS,), {}),
    "sincos2d_dtype_none": ("SinCos2DPositionalEncoding", (2, 3, 8), {"dtype": None}, (np.array([0, 5, 2]),), {}),
}


@pytest.mark.parametrize("load_from", ["numpy", "torch"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_parity(case: str, load_from: str) -> None:
    name, ctor_args, ctor_kwargs, args, kwargs = CASES[case]
    assert_parity(name, ctor_args, ctor_kwargs, args=args, kwargs=kwargs, load_from=load_from)


def test_attend_parity() -> None:
    h = RNG.standard_normal((2, 3, 8)).astype(np.float32)
    assert_parity("TokenEmbedding", (50, 8), {"padding_idx": 0}, args=(h,), method="attend",
                  backward="attend_backward")


class _OneSeed:
    """Stands in for the NumPy layer's generator: its next dropout seed is ``seed``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.bit_generator = np.random.PCG64(0)   # the state a layer snapshots before drawing

    def integers(self, *args: Any, **kwargs: Any) -> int:
        return self.seed


def _same_dropout_seed(np_layer, t_layer) -> None:
    """Both layers draw the same dropout seed: torch's from its generator, NumPy the same number."""
    t_layer.generator = torch.Generator().manual_seed(1234)
    seed = torch.randint(0, SEED_MASK, (), generator=torch.Generator().manual_seed(1234), dtype=torch.int64)
    np_layer._rng = _OneSeed(int(seed))


@pytest.mark.parametrize("norm", [None, "layernorm"])
def test_dropout_parity_in_training(norm: str | None) -> None:
    report = assert_parity("TransformerEmbedding", (50, 8, 16), {"dropout": 0.3, "norm": norm}, args=(IDS,),
                           prepare=_same_dropout_seed)
    out = report.np_outputs[0]
    assert 0 < np.mean(out == 0) < 0.6          # dropout did act


def test_eval_mode_parity_with_dropout() -> None:
    assert_parity("TransformerEmbedding", (50, 8, 16), {"dropout": 0.5}, args=(IDS,), train=False)


def test_helper_catches_a_mismatch() -> None:
    """The helper is not vacuous: a torch layer with different weights fails it."""
    def spoil(np_layer, t_layer) -> None:
        with torch.no_grad():
            t_layer.weight[int(IDS[0, 0])] += 1e-3

    with pytest.raises(AssertionError, match="out0"):
        assert_parity("TokenEmbedding", (50, 8), {}, args=(IDS,), prepare=spoil)


@pytest.mark.slow  # hypothesis over every option
@FAST
@given(ids=id_arrays(40, padding_idx=0), norm=st.sampled_from([None, "layernorm", "rmsnorm"]),
       positional=st.sampled_from(["learned", "sinusoidal", "none"]), num_token_types=st.integers(0, 3),
       start_pos=st.integers(0, 4), scale=st.booleans(), padding_positions=st.booleans())
def test_transformer_embedding_parity_property(ids: np.ndarray, norm: str | None, positional: str,
                                               num_token_types: int, start_pos: int, scale: bool,
                                               padding_positions: bool) -> None:
    kw = {"norm": norm, "positional": positional, "num_token_types": num_token_types, "scale": scale,
          "padding_idx": 0, "position_ids": "padding" if padding_positions else "default"}
    call = {"start_pos": start_pos}
    if num_token_types:
        call["token_type_ids"] = (np.arange(ids.size).reshape(ids.shape) % num_token_types).astype(np.int64)
    assert_parity("TransformerEmbedding", (40, 6, 16), kw, args=(ids,), kwargs=call)
