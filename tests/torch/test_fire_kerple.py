"""tokenpos.torch.FIRE / KERPLE: shapes, dtypes, init from torch's generator, errors, attention routing."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tokenpos.tables import ConfigError  # noqa: E402
from tokenpos.torch import scaled_dot_product_attention  # noqa: E402
from tokenpos.torch.fire import FIRE  # noqa: E402
from tokenpos.torch.kerple import KERPLE  # noqa: E402


@pytest.mark.parametrize("cls", [FIRE, KERPLE])
def test_bias_shape_dtype_and_generator_init(cls) -> None:
    layer = cls(4, dtype=torch.float64)
    assert layer.kind == "bias" and layer.bias(3, 7).shape == (4, 3, 7) and layer(3, 7).dtype == torch.float64
    a = cls(4, generator=torch.Generator().manual_seed(3))
    b = cls(4, generator=torch.Generator().manual_seed(3))
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    b.reset_parameters(seed=0)
    assert not torch.equal(a(2, 2), b(2, 2))
    with pytest.raises(ConfigError, match="num_heads"):
        cls(0)
    with pytest.raises(ConfigError, match="q_len"):
        a(4, 2)


@pytest.mark.parametrize("cls", [FIRE, KERPLE])
def test_attention_adds_the_bias_and_trains_it(cls) -> None:
    layer = cls(2, seed=0)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    out = scaled_dot_product_attention(q, k, v, positional=layer, causal=True)
    logits = q @ k.transpose(-1, -2) / 2.0 + layer(5, 5)[None]
    logits = logits.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(out, torch.softmax(logits, -1) @ v)
    out.sum().backward()
    assert all(p.grad is not None for p in layer.parameters())


def test_fire_bf16_computes_in_fp32() -> None:
    a, b = FIRE(2, seed=0), FIRE(2, seed=0, dtype=torch.bfloat16)
    assert b(6, 6).dtype == torch.bfloat16
    torch.testing.assert_close(b(6, 6).float(), a(6, 6), atol=0.05, rtol=0.02)


def test_kerple_projection_in_place() -> None:
    layer = KERPLE(2, seed=0)
    with torch.no_grad():
        layer.r2.fill_(-3.0)
    layer(2, 2)
    assert torch.all(layer.r2 == np.float32(0.01))
