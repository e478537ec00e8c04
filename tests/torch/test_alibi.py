"""tokenpos.torch.ALiBi: Bloom parity, NumPy equality, dtype handling, compile."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.tolerances import TOL
from tokenpos.tables import ConfigError, alibi_bias
from tokenpos.torch.alibi import ALiBi

pytest.importorskip("transformers")
from transformers.models.bloom.modeling_bloom import build_alibi_tensor  # noqa: E402


@pytest.mark.parametrize("num_heads", [6, 8, 12, 16, 20])
def test_slopes_and_bias_match_bloom(num_heads: int) -> None:
    layer = ALiBi(num_heads, dtype=torch.float32)
    bloom = build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)[:, 0, 1]
    np.testing.assert_allclose(layer.slopes.numpy(), bloom.numpy(), **TOL["hf.alibi_slopes"])
    length = 12
    full = build_alibi_tensor(torch.ones(1, length), num_heads, torch.float32)[:, 0, :]        # (H, L): m * j
    ours = layer.bias(length, length) + layer.slopes[:, None, None].float() * torch.arange(length)[None, :, None]
    causal = torch.ones(length, length).tril().bool()
    torch.testing.assert_close(ours[:, causal], full[:, None, :].expand(-1, length, -1)[:, causal],
                               rtol=TOL["hf.alibi_slopes"]["rtol"], atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_equals_tables_in_every_dtype(dtype: torch.dtype) -> None:
    out = ALiBi(6, dtype=dtype).bias(3, 7)
    assert out.dtype == dtype and out.shape == (6, 3, 7)
    expected = torch.from_numpy(alibi_bias(6, 3, 7)).to(dtype)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_casts_keep_float64_slopes_and_compile() -> None:
    layer = ALiBi(5).to(torch.float16)
    assert layer.slopes.dtype == torch.float64 and layer.state_dict() == {}
    torch._dynamo.reset()
    compiled = torch.compile(lambda: layer.bias(4, 6), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(), layer.bias(4, 6), rtol=0, atol=0)
    with pytest.raises(ConfigError, match="q_len 3 is greater than k_len 2"):
        layer.bias(3, 2)
