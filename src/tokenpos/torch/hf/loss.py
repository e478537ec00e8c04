"""``patch(model, loss=True)``: a ``*ForCausalLM``'s training loss from its final hidden states, without logits.

HF's causal-LM forward computes ``logits = self.lm_head(h)`` (B, L, V) for every token, maybe soft-caps or
scales them, and calls ``self.loss_function(logits, labels, vocab_size, **kwargs)`` (``ForCausalLMLoss``:
the shift, ``ignore_index``, ``num_items_in_batch``). At V = 128,256 those logits and their gradient are most
of a training step's memory. With this patch, a forward in training mode given ``labels`` runs HF's own
forward unchanged except for two things:

- the output head (an ``nn.Linear``, the SAME module: tied heads stay tied) records its input h (B, L', D)
  (L' after ``logits_to_keep``) and returns an empty (B, L', 0) tensor, so whatever HF does to the logits
  after it (``.float()``, the soft-cap) costs nothing;
- the model's ``loss_function`` computes HF's ``ForCausalLMLoss`` from h and the head's weight (and bias)
  with :func:`tokenpos.torch.tied_cross_entropy` (chunked: one block of logits at a time).

The forward then returns ``logits=None`` (Liger-Kernel does the same). In eval mode, or without
``labels``, the forward is HF's own (logits for generation and for evaluation metrics).

What HF does between the head and the loss must be something the tied loss reproduces; :func:`loss_plan`
reads it from the class's ``forward`` source (the statements between the head's one call and the
``loss_function`` call) and refuses a class whose statements are not in :data:`_LOGIT_STEPS`:

| HF statement | here |
| --- | --- |
| ``logits = self.<head>(h)`` (``.float()`` after it) | the head: h and its weight (and bias) |
| ``logits = logits / self.config.logits_scaling`` (Granite) | h times 1 / logits_scaling (before any cap) |
| ``logits = logits * self.logit_scale`` (Cohere) | h times logit_scale (before any cap) |
| the ``final_logit_softcapping`` block (Gemma 2 / 3) | ``softcap=`` of the tied loss |

A head with a bias (GPT-J) gives the tied loss [h, s] against [W, b] (one (V, D + 1) copy of the table,
never an (N, V) one). Losses are float32 for fp16 / bf16 / float32 models (HF's ``logits.float()``);
float64 for a float64 model (HF: float32). Every label ignored gives loss 0 and zero gradients where HF's
"mean" gives NaN (with ``num_items_in_batch`` HF gives 0 too).

Shapes: B batch, L length, L' positions kept, D hidden, V vocab, N = B * L' tokens.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tokenpos.tables.errors import ConfigError
from tokenpos.torch.tied_loss import tied_cross_entropy

_STATE = "_tokenpos_loss"

_SOFTCAP = ("if self.config.final_logit_softcapping is not None:\n"
            "    logits = logits / self.config.final_logit_softcapping\n"
            "    logits = torch.tanh(logits)\n"
            "    logits = logits * self.config.final_logit_softcapping")

#: The statements HF may run between the head and its loss (``ast.unparse`` spelling) -> what they are here.
_LOGIT_STEPS = {
    "loss = None": None,
    _SOFTCAP: "softcap",
    "logits = logits / self.config.logits_scaling": "logits_scaling",
    "logits = logits * self.logit_scale": "logit_scale",
}


@dataclass(frozen=True)
class LossPlan:
    """What :func:`loss_plan` read from a ``*ForCausalLM`` class: the head's attribute name, and the steps
    HF applies to its logits ("logits_scaling" / "logit_scale" first, then "softcap"), in order."""

    head: str
    steps: tuple[str, ...]


class _Capture:
    """One model's loss-mode state: ``active`` during a forward given labels, ``h`` / ``head`` the head's
    input and module of that forward (set by the head, taken by the loss)."""

    def __init__(self, plan: LossPlan, hf_loss: Any) -> None:
        self.plan, self.hf_loss = plan, hf_loss
        self.active = False
        self.h: torch.Tensor | None = None
        self.head: nn.Linear | None = None


# ----------------------------------------------------------------------------------------------
# the plan: what the class's forward does with its logits
# ----------------------------------------------------------------------------------------------


def _refuse(model: Any, why: str) -> ConfigError:
    return ConfigError(f"patch(loss=True) cannot compute the loss of this {type(model).__name__} without its "
                       f"logits: {why}; pass loss=False")


def _head_name(model: Any) -> str:
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = [n for n, m in model.named_children() if m is out]
    if out is None or len(names) != 1:
        raise _refuse(model, f"expected an output head that is a direct child module, got {type(out).__name__}")
    return names[0]


def _head_problem(head: Any) -> str | None:
    """Why the tied loss cannot stand in for this head module, or None."""
    if type(head) is not nn.Linear:
        return f"expected an nn.Linear output head, got {type(head).__name__}"
    hooks = [n for n in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
             if getattr(head, n, None)]
    if hooks:
        return f"its output head has hooks ({', '.join(hooks)}), which the loss would bypass"
    if "forward" in vars(head):
        return "its output head has a forward of its own"
    return None


def _calls(node: ast.AST, head: str) -> int:
    return sum(1 for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == head and isinstance(n.func.value, ast.Name) and n.func.value.id == "self")


def _is_head_statement(stmt: ast.stmt, head: str) -> bool:
    """``logits = self.<head>(x)`` or ``logits = self.<head>(x).float()``."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id == "logits" and isinstance(stmt.value, ast.Call)):
        return False
    call = stmt.value
    if isinstance(call.func, ast.Attribute) and call.func.attr == "float" and not call.args and not call.keywords \
            and isinstance(call.func.value, ast.Call):
        call = call.func.value
    return (isinstance(call.func, ast.Attribute) and call.func.attr == head and isinstance(call.func.value, ast.Name)
            and call.func.value.id == "self" and len(call.args) == 1 and not call.keywords)


def _is_loss_statement(stmt: ast.stmt) -> bool:
    """``if labels is not None: loss = self.loss_function(logits, labels, ...)`` (or ``logits=``, ``labels=``)."""
    if not (isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "labels is not None" and not stmt.orelse
            and len(stmt.body) == 1 and isinstance(stmt.body[0], ast.Assign)):
        return False
    call = stmt.body[0].value
    if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "self.loss_function"):
        return False
    args = [ast.unparse(a) for a in call.args]
    kw = {k.arg: ast.unparse(k.value) for k in call.keywords if k.arg is not None}
    return (args[:1] == ["logits"] or kw.get("logits") == "logits") and \
        (args[1:2] == ["labels"] or kw.get("labels") == "labels")


def _forward_statements(cls: type) -> list[ast.stmt]:
    fn = inspect.unwrap(cls.forward)                      # type: ignore[attr-defined]
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        raise TypeError("not a function")
    return node.body


def loss_plan(model: Any) -> LossPlan:
    """Check that ``model`` is a ``*ForCausalLM`` whose forward the tied loss reproduces; read what it does.

    Raises:
        ConfigError: not a ``*ForCausalLM``, a head that is not a plain ``nn.Linear``, a custom
            ``loss_function``, a forward already replaced, or logit steps outside :data:`_LOGIT_STEPS`
            (the message quotes the statement). Nothing is changed.
    """
    from transformers.loss.loss_utils import ForCausalLMLoss

    cls = type(model)
    if not cls.__name__.endswith("ForCausalLM"):
        raise _refuse(model, "it is not a *ForCausalLM model")
    if "forward" in vars(model) or "_loss_function" in vars(model):
        raise _refuse(model, "its forward or loss_function is already replaced on the instance")
    if model.loss_function is not ForCausalLMLoss:
        raise _refuse(model, f"its loss_function is {model.loss_function!r}, not HF's ForCausalLMLoss")
    head = _head_name(model)
    problem = _head_problem(getattr(model, head))
    if problem:
        raise _refuse(model, problem)
    try:
        body = _forward_statements(cls)
    except (OSError, TypeError, SyntaxError) as e:
        raise _refuse(model, f"the source of {cls.__name__}.forward cannot be read ({e})") from None
    whole = ast.Module(body=body, type_ignores=[])
    starts = [i for i, s in enumerate(body) if _is_head_statement(s, head)]
    if _calls(whole, head) != 1 or len(starts) != 1:
        raise _refuse(model, f"{cls.__name__}.forward does not call self.{head} once, as `logits = self.{head}(h)`")
    steps: list[str] = []
    i = starts[0] + 1
    while i < len(body) and not _is_loss_statement(body[i]):
        src = ast.unparse(body[i])
        if src not in _LOGIT_STEPS:
            raise _refuse(model, f"{cls.__name__}.forward runs `{src.splitlines()[0]}` between its head and its loss")
        step = _LOGIT_STEPS[src]
        if step is not None:
            if "softcap" in steps or step in steps:
                raise _refuse(model, f"{cls.__name__}.forward scales its logits after capping them")
            steps.append(step)
        i += 1
    if i == len(body):
        raise _refuse(model, f"{cls.__name__}.forward has no `if labels is not None: loss = self.loss_function(logits, "
                             "labels, ...)`")
    for stmt in body[i + 1:]:
        if not isinstance(stmt, ast.Return) and any(isinstance(n, ast.Name) and n.id == "logits"
                                                    for n in ast.walk(stmt)):
            raise _refuse(model, f"{cls.__name__}.forward reads its logits after the loss "
                                 f"(`{ast.unparse(stmt).splitlines()[0]}`)")
    return LossPlan(head=head, steps=tuple(steps))


# ----------------------------------------------------------------------------------------------
# the loss
# ----------------------------------------------------------------------------------------------


def causal_lm_loss(h: torch.Tensor, head: nn.Linear, labels: torch.Tensor | None, *, scale: float | None = None,
                   softcap: float | None = None, num_items_in_batch: Any = None, ignore_index: int = -100,
                   shift_labels: torch.Tensor | None = None) -> torch.Tensor:
    """HF's ``ForCausalLMLoss(cap(scale * head(h)), labels, ...)`` without the logits.

    h (B, L', D) (or (N, D)), the head's weight (V, D) and bias (V,) or None; labels (B, L') shifted here
    (the last position gets ``ignore_index``), or ``shift_labels`` (B, L') as they are. "mean" over the
    non-ignored targets, or with ``num_items_in_batch`` (int or tensor) the sum divided by it. -> loss ().

    Raises:
        ConfigError: targets whose count is not h's token count. TokenIdError: a target outside [0, V).
    """
    if shift_labels is None:
        if labels is None:
            raise ConfigError("the causal-LM loss needs labels or shift_labels; got neither")
        shift_labels = nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    x = h.reshape(-1, h.shape[-1])                                            # (N, D)
    w = head.weight                                                           # (V, D)
    if scale is not None:
        x = x * scale
    if head.bias is not None:                                                 # [x, s] @ [W, b].T = x W.T + s b
        x = torch.cat([x, x.new_full((x.shape[0], 1), 1.0 if scale is None else scale)], dim=1)   # (N, D + 1)
        w = torch.cat([w, head.bias.unsqueeze(1)], dim=1)                     # (V, D + 1)
    t = shift_labels.reshape(-1).to(x.device)                                 # (N,)
    if t.shape[0] != x.shape[0]:
        raise ConfigError(f"the causal-LM loss got {t.shape[0]} targets (labels {tuple(shift_labels.shape)}) for "
                          f"{x.shape[0]} positions (hidden states {tuple(h.shape)}); expected one per position")
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = tied_cross_entropy(x, w, t, ignore_index=ignore_index, reduction=reduction, softcap=softcap)
    if num_items_in_batch is not None:
        n = num_items_in_batch.to(loss.device) if isinstance(num_items_in_batch, torch.Tensor) else num_items_in_batch
        loss = loss / n
    return loss


def _scale_and_cap(model: Any, steps: tuple[str, ...]) -> tuple[float | None, float | None]:
    scale = softcap = None
    for step in steps:
        if step == "logits_scaling":
            scale = 1.0 / float(model.config.logits_scaling)
        elif step == "logit_scale":
            scale = float(model.logit_scale)
        elif model.config.final_logit_softcapping is not None:
            softcap = float(model.config.final_logit_softcapping)
    return scale, softcap


def _loss_function(self: Any, logits: Any, labels: Any, vocab_size: Any = None, num_items_in_batch: Any = None,
                   ignore_index: int = -100, shift_labels: Any = None, **kwargs: Any) -> torch.Tensor:
    """The patched model's ``loss_function``: the tied loss from the head's recorded input, or HF's own loss of
    ``logits`` when the head recorded nothing (a head replaced since patch by a module of another kind)."""
    cap: _Capture = getattr(self, _STATE)
    h, head = cap.h, cap.head
    cap.h = cap.head = None
    if h is None or head is None:
        return cap.hf_loss(logits, labels, vocab_size, num_items_in_batch=num_items_in_batch,
                           ignore_index=ignore_index, shift_labels=shift_labels, **kwargs)
    scale, softcap = _scale_and_cap(self, cap.plan.steps)
    return causal_lm_loss(h, head, labels, scale=scale, softcap=softcap, num_items_in_batch=num_items_in_batch,
                          ignore_index=ignore_index, shift_labels=shift_labels)


def _head_forward(self: nn.Linear, input: torch.Tensor) -> torch.Tensor:
    """The head of a patched model: in a loss-mode forward, record h (..., D) and return (..., 0); else HF's."""
    cap: _Capture = getattr(self, _STATE)
    if cap.active:
        cap.h, cap.head = input, self
        return input.new_empty((*input.shape[:-1], 0))
    return nn.Linear.forward(self, input)


def _labels(sig: inspect.Signature, self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not args:
        return kwargs.get("labels")
    return sig.bind_partial(self, *args, **kwargs).arguments.get("labels")


def _without_logits(out: Any) -> Any:
    """HF's output with ``logits`` None (a ModelOutput rebuilt without it; a tuple (loss, logits, ...) with None)."""
    if isinstance(out, tuple):
        return (out[0], None, *out[2:])
    return type(out)(**{k: v for k, v in out.items() if k != "logits"})


def _install_head(model: Any, cap: _Capture) -> bool:
    """Give the model's current head the recording forward (again, after a resize replaced it); False when the
    head is no longer one the tied loss stands in for (the forward then computes HF's logits and loss)."""
    head = getattr(model, cap.plan.head, None)
    if getattr(head, _STATE, None) is cap:
        return True
    if _head_problem(head) is not None:
        return False
    object.__setattr__(head, _STATE, cap)
    head.forward = types.MethodType(_head_forward, head)           # type: ignore[union-attr]
    return True


def _make_forward(cls_forward: Any) -> Any:
    sig = inspect.signature(cls_forward)

    @functools.wraps(cls_forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        cap: _Capture = getattr(self, _STATE)
        if not self.training or _labels(sig, self, args, kwargs) is None or not _install_head(self, cap):
            return cls_forward(self, *args, **kwargs)
        cap.active, cap.h, cap.head = True, None, None
        try:
            out = cls_forward(self, *args, **kwargs)
        finally:
            cap.active, cap.h, cap.head = False, None, None
        return _without_logits(out)

    return forward


def apply_loss(model: Any, plan: LossPlan) -> None:
    """Install the loss mode planned by :func:`loss_plan` (no checks: the plan holds them)."""
    cap = _Capture(plan, model.loss_function)
    object.__setattr__(model, _STATE, cap)
    _install_head(model, cap)
    model.forward = types.MethodType(_make_forward(type(model).forward), model)
    model.loss_function = types.MethodType(_loss_function, model)


def remove_loss(model: Any) -> None:
    """Undo :func:`apply_loss`: the class's forward and loss_function, and the head's own forward, again."""
    cap = getattr(model, _STATE, None)
    if cap is None:
        return
    head = getattr(model, cap.plan.head, None)
    if head is not None and getattr(head, _STATE, None) is cap:
        del head.forward
        object.__delattr__(head, _STATE)
    del model.forward
    del model._loss_function
    object.__delattr__(model, _STATE)
