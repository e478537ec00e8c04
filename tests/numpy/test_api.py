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
