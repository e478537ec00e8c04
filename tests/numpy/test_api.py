"""The public contract of shared/API.md for the NumPy backend: names, aliases, signatures, defaults."""

from __future__ import annotations

import inspect
import subprocess
import sys

import numpy as np

import tokenpos
import tokenpos.numpy as tpn


def params(fn):
    return inspect.signature(fn).parameters


def test_names_and_aliases():
    assert isinstance(tokenpos.__version__, str)
    for name in ("TokenEmbedding", "LearnedPositionalEmbedding", "PositionalEmbedding",
                 "SinusoidalPositionalEncoding", "TransformerEmbedding", "EmbeddingLayer", "optim"):
        assert hasattr(tpn, name), name
    assert tpn.PositionalEmbedding is tpn.LearnedPositionalEmbedding
    assert tpn.EmbeddingLayer is tpn.TransformerEmbedding
    for name in ("SGD", "Adam", "AdamW"):
        assert hasattr(tpn.optim, name), name


def test_constructor_signatures():
    p = params(tpn.TokenEmbedding)
    assert list(p)[:2] == ["vocab_size", "d_model"]
    assert p["init"].default == "normal" and p["std"].default == 0.02 and p["scale"].default is False
    assert p["padding_idx"].default is None and p["init"].kind is inspect.Parameter.KEYWORD_ONLY
    assert {"dtype", "seed", "rng"} <= set(p) and p["dtype"].default is np.float32
    assert list(params(tpn.LearnedPositionalEmbedding))[:2] == ["max_seq_len", "d_model"]
    p = params(tpn.SinusoidalPositionalEncoding)
    assert list(p)[:2] == ["max_seq_len", "d_model"] and p["base"].default == 10000.0
    p = params(tpn.TransformerEmbedding)
    assert list(p)[:3] == ["vocab_size", "d_model", "max_seq_len"] and p["max_seq_len"].default == 512
    assert p["positional"].default == "learned" and p["scale"].default is False and p["dropout"].default == 0.0
    f = params(tpn.TransformerEmbedding.forward)
    assert list(f)[1:3] == ["ids", "positions"] and f["positions"].default is None
    assert f["start_pos"].default == 0 and f["start_pos"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params(tpn.optim.Adam)["weight_decay"].default == 0.0


def test_every_layer_has_the_training_interface():
    for layer in (tpn.TokenEmbedding(4, 2), tpn.LearnedPositionalEmbedding(4, 2),
                  tpn.SinusoidalPositionalEncoding(4, 2), tpn.TransformerEmbedding(4, 2, 4), tpn.LayerNorm(2),
                  tpn.RMSNorm(2)):
        for attr in ("parameters", "zero_grad", "backward", "state_dict", "load_state_dict", "train", "eval",
                     "save", "load", "forward"):
            assert callable(getattr(layer, attr)), (type(layer).__name__, attr)
        assert layer.training is True


def test_importing_does_not_pull_torch():
    code = ("import sys, tokenpos; assert 'torch' not in sys.modules and 'numba' not in sys.modules; "
            "import tokenpos.numpy; assert 'torch' not in sys.modules, 'tokenpos.numpy must not import torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


SCHEMES = {
    tpn.LearnedPositionalEmbedding: (8, 4), tpn.SinusoidalPositionalEncoding: (8, 4), tpn.RotaryEmbedding: (4,),
    tpn.ALiBi: (2,), tpn.T5RelativePositionBias: (2,), tpn.NoPositionalEncoding: (),
}


def test_every_scheme_takes_seed_or_rng_and_resets_alike():
    for cls, args in SCHEMES.items():
        a, b = cls(*args, seed=3), cls(*args, rng=np.random.default_rng(3))
        for layer in (a, b):
            layer.reset_parameters(seed=7)
        b.reset_parameters(rng=np.random.default_rng(7))
        for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
            np.testing.assert_array_equal(pa.data, pb.data, err_msg=f"{cls.__name__}.{name}")
        assert {"seed", "rng"} <= set(params(cls.reset_parameters)), cls
        assert all(params(cls.reset_parameters)[k].kind is inspect.Parameter.KEYWORD_ONLY for k in ("seed", "rng"))


def test_transformer_embedding_has_no_flattened_scheme_arguments():
    gone = {"base", "sinusoidal_layout", "head_dim", "rope_scaling", "rope_interleaved", "rotary_dim",
            "t5_num_buckets", "t5_max_distance", "t5_bidirectional"}
    assert not gone & set(params(tpn.TransformerEmbedding.__init__))
    assert "num_heads" in params(tpn.TransformerEmbedding.__init__)
