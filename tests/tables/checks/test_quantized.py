"""tables.checks.quantized: the one refusal text of an 8-bit table, naming the layer, its weight dtype, what was
asked and what is expected."""

from __future__ import annotations

from tokenpos.tables.checks.quantized import quantized_refusal
from tokenpos.tables.errors import ConfigError


class _Layer:
    weight_dtype = "int8"


def test_the_refusal_names_layer_dtype_what_and_the_expected_table():
    for layer, name in ((_Layer(), "_Layer"), (_Layer, "_Layer"), ("TokenEmbedding", "TokenEmbedding")):
        err = quantized_refusal(layer, "resize", None if layer != "TokenEmbedding" else "torch.float8_e4m3fn")
        assert isinstance(err, ConfigError)
        text = str(err)
        assert text.startswith("resize is not available for an 8-bit " + name)
        assert ("weight_dtype=int8" in text) != (layer == "TokenEmbedding")
        assert "expected a float table (weight_dtype=None)" in text
