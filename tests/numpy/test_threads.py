"""Threads: a NumPy layer shared by several threads gives every caller its serial result.

Guaranteed (docs/DESIGN.md, "NumPy backend"): forward-only use of a shared layer is thread-safe
(eval mode, or no dropout: the dropout seed comes from the layer's generator, so concurrent training
calls draw their seeds in an unspecified order). The functional pairs keep nothing between calls,
so forward + backward through them is thread-safe with per-call caches.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokenpos.numpy as tpn
from tokenpos.numpy import functional as F

THREADS = 4
D = 16
SHARED = settings(max_examples=8, deadline=None,                 # kernel_mode only flips a switch
                  suppress_health_check=[HealthCheck.function_scoped_fixture])


def layers() -> dict[str, tpn.Module]:
    return {
        "token": tpn.TokenEmbedding(50, D, scale=True, seed=0),
        "learned": tpn.LearnedPositionalEmbedding(64, D, seed=0),
        "sinusoidal": tpn.SinusoidalPositionalEncoding(16, D),            # longer calls compute rows on demand
        "transformer-learned": tpn.TransformerEmbedding(50, D, 64, scale=True, dropout=0.3, seed=0).eval(),
        "transformer-sinusoidal": tpn.TransformerEmbedding(50, D, 16, positional="sinusoidal", seed=0),
        "transformer-bert": tpn.TransformerEmbedding(50, D, 64, num_token_types=2, norm="layernorm", seed=0),
        "layernorm": tpn.LayerNorm(D),
        "rmsnorm": tpn.RMSNorm(D),
        "t5": tpn.T5RelativePositionBias(2, seed=0),
        "alibi": tpn.ALiBi(3),
    }


def call(name: str, layer: tpn.Module, length: int) -> np.ndarray:
    rng = np.random.default_rng(length)
    if name in ("layernorm", "rmsnorm"):
        return layer(rng.standard_normal((2, length, D)).astype(np.float32))
    kind = getattr(layer, "kind", None)                  # a positional scheme's kind; None for the other layers
    if kind == "bias":
        return layer.bias(length, length + 1)
    if kind == "additive":
        return layer(length)
    return layer(rng.integers(0, 50, (2, length)))


def run_concurrently(fn, args: list) -> list:
    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(fn, args))


@pytest.mark.slow  # hypothesis x threads
@given(st.lists(st.integers(1, 48), min_size=THREADS, max_size=4 * THREADS))
@SHARED
def test_shared_layers_give_every_thread_its_serial_result(kernel_mode, lengths):
    for name, layer in layers().items():
        serial = [call(name, layer, n) for n in lengths]
        concurrent = run_concurrently(lambda n, name=name, layer=layer: call(name, layer, n), lengths)
        for n, a, b in zip(lengths, serial, concurrent, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{name}, length {n}")


@pytest.mark.slow  # hypothesis x threads
@given(st.lists(st.integers(1, 48), min_size=THREADS, max_size=4 * THREADS))
@SHARED
def test_functional_pairs_keep_per_call_caches_under_threads(kernel_mode, lengths):
    rng = np.random.default_rng(0)
    weight, table = rng.standard_normal((50, D)).astype(np.float32), rng.standard_normal((64, D)).astype(np.float32)

    def step(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        r = np.random.default_rng(n)
        ids = r.integers(0, 50, (2, n))
        out, cache = F.embedding_forward(weight, ids, scale=4.0, table=table, pos=np.arange(n), p=0.2, seed=n,
                                         table_grad=True)
        (rows_at, rows), table_grad = F.embedding_backward(r.standard_normal(out.shape).astype(np.float32), cache)
        return out, rows_at, rows, table_grad

    serial = [step(n) for n in lengths]
    concurrent = run_concurrently(step, lengths)
    for a, b in zip(serial, concurrent, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
