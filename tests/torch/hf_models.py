"""Tiny random Hugging Face models for the tests of ``tokenpos.torch.hf`` (tests/torch/test_hf_*.py).

Each test file keeps its own configs (``BUILD``: name -> a function that constructs the model); these helpers
build them the same way everywhere: under a fixed global seed (HF draws its init, and the rows a resize
adds, from torch's global generator), HF's warnings about tiny configs silenced, never downloaded. Also the
token ids, the tolerance of a patched model against HF's own, and ``torch.compile`` of a patched model.

Shapes: B batch, L sequence, V vocab.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from tests.tolerances import TOL
from tokenpos.torch.hf import patch, unpatch

R = TypeVar("R")


def decoder_kwargs(vocab_size: int, hidden_size: int, intermediate_size: int, num_hidden_layers: int,
                   max_position_embeddings: int) -> dict[str, int]:
    """The config kwargs of a tiny Llama-like decoder (4 query heads, 2 key/value heads), which the
    ``*Config`` of every such family takes."""
    return {"vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": intermediate_size,
            "num_hidden_layers": num_hidden_layers, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": max_position_embeddings}


def seeded(call: Callable[[], R], seed: int = 0) -> R:
    """``call()`` right after ``torch.manual_seed(seed)``, its warnings silenced (a model's construction, a
    resize: HF draws their random rows from the global generator)."""
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call()


def eval_model(make: Callable[[], Any]) -> Any:
    """The model ``make()`` builds (seed 0), in eval mode, generating with pad id 0 (no warning per call)."""
    model = seeded(make)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = 0
    return model.eval()


def token_ids(seed: int, shape: tuple[int, int] = (2, 12)) -> torch.Tensor:
    """(B, L) ids in [3, 100) (no pad / bos / eos id), from their own generator."""
    return torch.randint(3, 100, shape, generator=torch.Generator().manual_seed(seed))


def assert_hf_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """A patched model's output against the unpatched HF model's: equal to fp32 rounding (``TOL["hf.patch"]``)."""
    torch.testing.assert_close(got, want, **TOL["hf.patch"])


def compiled_patched(model: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``(got, want, targets)``: the logits (B, L, V) of ``patch(model)`` compiled with ``fullgraph=True``, the
    unpatched model's logits (B, L, V), and the targets of the one graph's nodes (a recording backend that
    runs the graph as traced). The model is unpatched again before this returns."""
    targets: list[str] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        targets.extend(str(n.target) for n in gm.graph.nodes)
        return gm.forward

    with torch.no_grad():
        want = model(ids).logits
        patch(model)
        got = torch.compile(model, backend=backend, fullgraph=True)(ids).logits
    unpatch(model)
    return got, want, targets
