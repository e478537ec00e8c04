"""Fine-tune a tiny random Llama with Hugging Face's ``Trainer``, patched (``patch(model, loss=True)``) and not,
and show that the two loss curves are the same.

    python -m tokenpos.examples.hf_trainer --steps 6

Both runs start from the same weights and see the same packed batches: ``DataCollatorWithFlattening`` puts
each micro-batch's documents in one row (positions restarting at 0, -100 at each document's first label),
``gradient_accumulation_steps=2``, so the Trainer passes ``num_items_in_batch`` (the labels of both
micro-batches) to the model's loss. The patched model computes that loss from its final hidden states
with tokenpos's tied loss, never the (1, T, V) logits. Every micro-batch's loss is recorded (full float32,
not the Trainer's 4-digit log); the script prints both curves and exits with status 1 unless they agree to
float32 rounding (``LOSS_RTOL``, relative per step) and the final weights too.

Needs ``transformers`` and ``accelerate`` (the Trainer's dependency). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import warnings
from collections.abc import Sequence
from typing import Any

import torch

LOSS_RTOL = 1e-5       # per micro-batch loss, patched vs unpatched: float32 sums in another order, a few steps deep
WEIGHT_RTOL = 1e-5     # max |a - b| / max |b| of each final weight (plain SGD: Adam's 1 / (sqrt(v) + eps) would
                       # blow the rounding of near-zero gradients up to lr-sized steps in either run alike)


def tiny_llama(vocab_size: int = 512, seed: int = 0) -> Any:
    """A random LlamaForCausalLM (tied head, 2 layers, hidden 64), from a seeded global generator (HF's init)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    kw: dict[str, Any] = {"vocab_size": vocab_size, "hidden_size": 64, "intermediate_size": 128,
                          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                          "max_position_embeddings": 256, "tie_word_embeddings": True, "attn_implementation": "sdpa"}
    return LlamaForCausalLM(LlamaConfig(**kw))


def documents(n: int, vocab_size: int, seed: int) -> list[dict[str, list[int]]]:
    """n random documents of 8 to 40 tokens: the dataset (a list the Trainer indexes)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 41, (n,), generator=g).tolist()
    return [{"input_ids": torch.randint(0, vocab_size, (k,), generator=g).tolist()} for k in lengths]


def train(model: Any, data: list[dict[str, list[int]]], *, steps: int, seed: int) -> list[float]:
    """Train ``model`` with HF's Trainer for ``steps`` optimiser steps; -> every micro-batch's loss as computed."""
    from transformers import DataCollatorWithFlattening, PrinterCallback, Trainer, TrainingArguments

    losses: list[float] = []

    class Recording(Trainer):  # type: ignore[misc]
        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            loss: Any = out[0] if return_outputs else out
            losses.append(float(loss.detach()))
            return out

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, max_steps=steps, per_device_train_batch_size=4, gradient_accumulation_steps=2,
            optim="sgd", learning_rate=0.5, lr_scheduler_type="constant", weight_decay=0.0, save_strategy="no",
            report_to=[], use_cpu=True, seed=seed, data_seed=seed, dataloader_num_workers=0,
            logging_strategy="no", remove_unused_columns=False, disable_tqdm=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = Recording(model=model, args=args, train_dataset=data,
                                data_collator=DataCollatorWithFlattening())
            trainer.remove_callback(PrinterCallback)                   # the script prints, not the Trainer
            trainer.train()
    return losses


def compare(steps: int = 6, vocab_size: int = 512, seed: int = 0) -> dict[str, Any]:
    """Train the unpatched and the patched copy of one tiny Llama on the same batches.

    Returns:
        {"hf": losses, "tokenpos": losses, "loss_rel": max relative difference per micro-batch,
        "weight_rel": max over the weights of max |a - b| / max |b| after training}.
    """
    from tokenpos.torch.hf import patch

    base = tiny_llama(vocab_size, seed)
    data = documents(16 * steps, vocab_size, seed + 1)
    hf_model, ours = copy.deepcopy(base), copy.deepcopy(base)
    patch(ours, loss=True)
    hf = train(hf_model, data, steps=steps, seed=seed)
    tp = train(ours, data, steps=steps, seed=seed)
    loss_rel = max(abs(a - b) / abs(b) for a, b in zip(tp, hf, strict=True))
    with torch.no_grad():
        weight_rel = max(float((a - b).abs().max() / b.abs().max())
                         for a, b in zip(ours.parameters(), hf_model.parameters(), strict=True))
    return {"hf": hf, "tokenpos": tp, "loss_rel": loss_rel, "weight_rel": weight_rel}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="optimiser steps (2 micro-batches each)")
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)
    r = compare(a.steps, a.vocab_size, a.seed)
    print(f"tiny Llama, vocab {a.vocab_size}, {a.steps} steps of 2 packed micro-batches (Trainer, SGD)")
    print(f"{'micro-batch':>11}  {'HF loss':>12}  {'patched loss':>12}")
    for i, (h, t) in enumerate(zip(r["hf"], r["tokenpos"], strict=True)):
        print(f"{i:>11}  {h:>12.8f}  {t:>12.8f}")
    ok = r["loss_rel"] <= LOSS_RTOL and r["weight_rel"] <= WEIGHT_RTOL
    print(f"max relative loss difference {r['loss_rel']:.2e} (<= {LOSS_RTOL:g}), final weights {r['weight_rel']:.2e} "
          f"(<= {WEIGHT_RTOL:g}): {'equal' if ok else 'DIFFERENT'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
