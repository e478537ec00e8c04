"""A patched model reads its modeling module's globals live, as an unpatched one does, but for the RoPE helper.

``patch`` used to run the attention forwards with a copy of the module's globals taken at patch time, so a
later swap of e.g. ``modeling_llama.eager_attention_forward`` (profilers, kernel libraries, attention
backends do this) reached every model but the patched one (issue 48, item 2).
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

from tests.torch.hf_models import decoder_kwargs
from tokenpos.torch.hf import patch, unpatch
from tokenpos.torch.hf.families import innermost

transformers = pytest.importorskip("transformers")
T = transformers
LAYERS = 2
KW = decoder_kwargs(128, 32, 32, LAYERS, 64)


def _llama() -> Any:
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**KW)).eval()
    model.config._attn_implementation = "eager"                  # the attention calls eager_attention_forward
    return model


def _ids() -> torch.Tensor:
    return torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(0))


def test_a_swap_after_patch_reaches_the_patched_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.llama import modeling_llama

    hp = importlib.import_module("tokenpos.torch.hf.rope_helpers")   # the replacements call the op
    ops: list[int] = []
    real_op = hp.rotate_qk
    monkeypatch.setattr(hp, "rotate_qk", lambda *a: ops.append(1) or real_op(*a))
    patched, plain = _llama(), _llama()
    ids = _ids()
    with torch.no_grad():
        want = plain(ids).logits
        patch(patched)
        seen: list[str] = []
        real = modeling_llama.eager_attention_forward

        def counting(module: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append("patched" if "forward" in vars(module) else "plain")
            return real(module, *args, **kwargs)

        monkeypatch.setattr(modeling_llama, "eager_attention_forward", counting)     # a swap after patch
        got = patched(ids).logits
        assert seen == ["patched"] * LAYERS and len(ops) == LAYERS   # the new function, and tokenpos's RoPE
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        seen.clear()
        assert torch.equal(plain(ids).logits, want) and seen == ["plain"] * LAYERS
        # the one name patch replaced stays tokenpos's for the patched model, HF's (or the new one) for others
        rope_calls: list[int] = []
        real_rope = modeling_llama.apply_rotary_pos_emb
        monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb",
                            lambda *a, **k: rope_calls.append(1) or real_rope(*a, **k))
        ops.clear()
        patched(ids)
        assert not rope_calls and len(ops) == LAYERS
        plain(ids)
        assert len(rope_calls) == LAYERS and len(ops) == LAYERS
        unpatch(patched)
        seen.clear()
        rope_calls.clear()
        assert torch.equal(patched(ids).logits, want)               # the class's forward: every swap reaches it
        assert seen == ["plain"] * LAYERS and len(rope_calls) == LAYERS and len(ops) == LAYERS


def test_the_patched_forward_runs_with_the_modules_own_globals() -> None:
    """Not a copy: the innermost function's globals are the modeling module's dict itself; patch adds one
    private name there (the tokenpos function under ``_tokenpos_<name>``) and changes none of HF's."""
    from transformers.models.llama import modeling_llama

    hf_names = {k: v for k, v in vars(modeling_llama).items() if not k.startswith("_tokenpos_")}
    model = _llama()
    patch(model)
    attn = model.model.layers[0].self_attn
    fn = innermost(attn.forward.__func__)
    assert fn.__globals__ is vars(modeling_llama)
    assert fn is not innermost(type(attn).forward) and "apply_rotary_pos_emb" not in fn.__code__.co_names
    assert {k: v for k, v in vars(modeling_llama).items() if not k.startswith("_tokenpos_")} == hf_names
    unpatch(model)
