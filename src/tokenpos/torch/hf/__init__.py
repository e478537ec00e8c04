"""Hugging Face models: ``from_hf(model)`` (the input block as a TransformerEmbedding; for Gemma 3n / Gemma 4
text models also ``per_layer_from_hf(model)``, their per-layer table, and ``rotary_from_hf(model)``, their RoPE
per layer type) and ``patch(model)`` / ``unpatch(model)`` (tokenpos's RoPE op and token embedding inside the
model itself).

The per-family knowledge of ``patch`` is one table, :data:`tokenpos.torch.hf.families.FAMILIES`.
Transformers is never imported at this package's import; ``patch`` imports the family's modeling
module it replaces a function of.
"""

from tokenpos.torch.hf.from_hf import from_hf, per_layer_from_hf, rotary_from_hf
from tokenpos.torch.hf.patch import PatchReport, patch, unpatch

__all__ = ["PatchReport", "from_hf", "patch", "per_layer_from_hf", "rotary_from_hf", "unpatch"]
