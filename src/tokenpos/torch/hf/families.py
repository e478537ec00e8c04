"""What ``patch`` replaces in each Hugging Face model family: one table, :data:`FAMILIES`.

Each family's attention calls one module-level RoPE function of its modeling module
(``transformers.models.<module>.modeling_<module>``); ``patch`` swaps that function for a tokenpos
one (as Liger-Kernel's ``monkey_patch.py`` does) and the input embedding for a ``TokenEmbedding``.
The RoPE functions differ only in their calling convention (``rope`` below):

| rope | HF function | q, k | tables |
| --- | --- | --- | --- |
| "qk" | ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` | (B, H, L, Dh) | cos, sin (B, L, R) = [c, c] |
| "gptj" | ``apply_rotary_pos_emb(x, sin, cos)``, once per tensor | x (B, L, H, R) | sin, cos (B, L, R/2), interleaved |
| "llama4" | ``apply_rotary_emb(xq, xk, freqs_cis)`` | (B, L, H, Dh) | complex (B, L, F), interleaved |

R is the rotary dim (partial rotary: GPT-NeoX ``rotary_pct``, Phi-3 ``partial_rotary_factor``; GPT-J
``rotary_dim``), F = R/2. M-RoPE (Qwen2-VL, Qwen2.5-VL) reaches the "qk" function with the three
position axes already merged into cos / sin (B, L, Dh), so it needs nothing more; Llama 4's NoPE
layers skip the function and its attention temperature stays HF's own code.

``angles`` says how ``patch(angles="exact")`` rebuilds the rotary module's tables in float64 from the
config: "rope" (``RotaryEmbedding.from_hf_config``), "layer_types" (one per ``config.layer_types``
entry: Gemma 3), "mrope" (``MRotaryEmbedding.from_hf_config``). ``embed_scale``: "none" (the
embedding is a plain ``nn.Embedding``) or "buffer" (HF's ``*ScaledWordEmbedding``: rows times
``embed_scale`` rounded to the weight dtype, Gemma 2 / 3).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One family's record (see the module docstring for each field's values)."""

    module: str | None = None         # transformers.models.<module>.modeling_<module>; None: embedding only
    rope: str | None = None           # "qk" | "gptj" | "llama4" | None
    function: str = "apply_rotary_pos_emb"
    rotary_class: str | None = None   # the class of the model's rotary module (rebuilt by angles="exact")
    angles: str = "rope"              # "rope" | "layer_types" | "mrope"
    embed_scale: str = "none"         # "none" | "buffer"


def _qk(module: str, rotary_class: str, **kw: str) -> Family:
    return Family(module=module, rope="qk", rotary_class=rotary_class, **kw)


FAMILIES: dict[str, Family] = {
    "llama": _qk("llama", "LlamaRotaryEmbedding"),
    "mistral": _qk("mistral", "MistralRotaryEmbedding"),
    "qwen2": _qk("qwen2", "Qwen2RotaryEmbedding"),
    "qwen3": _qk("qwen3", "Qwen3RotaryEmbedding"),
    "phi3": _qk("phi3", "Phi3RotaryEmbedding"),
    "gpt_neox": _qk("gpt_neox", "GPTNeoXRotaryEmbedding"),
    "granite": _qk("granite", "GraniteRotaryEmbedding"),   # embedding_multiplier: in HF's model forward
    "gemma2": _qk("gemma2", "Gemma2RotaryEmbedding", embed_scale="buffer"),
    "gemma3_text": _qk("gemma3", "Gemma3RotaryEmbedding", angles="layer_types", embed_scale="buffer"),
    "gemma3": _qk("gemma3", "Gemma3RotaryEmbedding", angles="layer_types", embed_scale="buffer"),  # + vision
    "qwen2_vl": _qk("qwen2_vl", "Qwen2VLRotaryEmbedding", angles="mrope"),
    "qwen2_5_vl": _qk("qwen2_5_vl", "Qwen2_5_VLRotaryEmbedding", angles="mrope"),
    "gptj": Family(module="gptj", rope="gptj", rotary_class="GPTJRotaryEmbedding"),
    "llama4_text": Family(module="llama4", rope="llama4", function="apply_rotary_emb",
                          rotary_class="Llama4TextRotaryEmbedding"),
    "gpt2": Family(),
    "bert": Family(),
    "roberta": Family(),
}
