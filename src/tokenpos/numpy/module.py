"""Parameters and modules of the NumPy backend.

A `Parameter` holds its data and a gradient that may be dense or row-sparse. Embedding lookups add
row-sparse chunks (the ids used and their rows), so a training step never has to build a dense
(V, D) array; reading ``.grad`` materialises the dense view when someone asks for it.

A `Module` owns parameters and sub-modules, and gives ``state_dict`` / ``load_state_dict`` (checked
before anything is written), safetensors ``save`` / ``load``, ``train`` / ``eval`` and ``zero_grad``.

Shapes: V rows (vocab or positions), D columns, n ids in a chunk.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from tokenpos.tables.checks.validation import (
    check_state_dict,
    check_state_mapping,
    dtype_name,
    numpy_dtype_message,
    numpy_holds,
    shape_message,
)
from tokenpos.tables.errors import StateDictError


@dataclass(frozen=True)
class RowSparseGrad:
    """A gradient that is zero outside a few rows.

    Attributes:
        indices: (n,) int64, unique and sorted row ids.
        rows: (n, D) summed gradient rows, same dtype as the parameter.
    """

    indices: np.ndarray
    rows: np.ndarray

    def to_dense(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dense = np.zeros(shape, dtype=dtype)
        dense[self.indices] = self.rows
        return dense


def coalesce_rows(indices: np.ndarray, rows: np.ndarray) -> RowSparseGrad:
    """Sum duplicate ids: (n,), (n, D) -> unique sorted ids (u,), summed rows (u, D)."""
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    if indices.size == 0:
        return RowSparseGrad(indices, rows.reshape(0, rows.shape[-1]))
    order = np.argsort(indices, kind="stable")
    sorted_ids = indices[order]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
    summed = np.add.reduceat(rows[order], starts, axis=0)
    return RowSparseGrad(sorted_ids[starts], summed.astype(rows.dtype, copy=False))


class Parameter:
    """A trainable array with a dense-or-row-sparse gradient.

    Attributes:
        data: the array (updated in place by optimisers).
        requires_grad: False freezes it (``parameters()`` leaves it out; backward adds nothing).
    """

    def __init__(self, data: np.ndarray, requires_grad: bool = True) -> None:
        self.data = data
        self.requires_grad = requires_grad
        self._dense: np.ndarray | None = None
        self._chunks: list[RowSparseGrad] = []
        # the rows a dense gradient holds when only row-sparse backwards made it (unique, sorted); None once a
        # dense gradient was added or set: then every row may hold one
        self._touched: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    # -- gradient ------------------------------------------------------------------------------
    @property
    def grad(self) -> np.ndarray | None:
        """The dense gradient, or None before any backward.

        Reading it folds any row-sparse chunks into one dense array, so what you read, clip or edit in place
        is what the optimiser uses. The rows the backwards touched stay known: ``sparse_grad`` then reads them
        from this array, so reading the gradient (a norm for a log) never turns a lazy optimiser's row update
        into a dense one. Edit those rows; a value written into another row of a row-sparse gradient is not
        read (set ``grad`` to make a dense gradient of your own).
        """
        if self._chunks:
            fresh = self._dense is None
            dense = np.zeros_like(self.data) if self._dense is None else self._dense
            for chunk in self._chunks:
                dense[chunk.indices] += chunk.rows
            if fresh or self._touched is not None:
                self._touched = np.unique(np.concatenate([c.indices for c in self._chunks]
                                                         + ([] if fresh else [self._touched])))
            self._dense, self._chunks = dense, []
        return self._dense

    @grad.setter
    def grad(self, value: np.ndarray | None) -> None:
        if value is not None and np.shape(value) != self.data.shape:
            raise ValueError(shape_message("grad", self.data.shape, np.shape(value)))
        self._dense = None if value is None else np.asarray(value, dtype=self.data.dtype)
        self._chunks, self._touched = [], None

    @property
    def sparse_grad(self) -> RowSparseGrad | None:
        """The gradient as unique sorted ids + summed rows, or None if it is dense or absent (a dense
        gradient that only row-sparse backwards made, folded by reading ``grad``, gives its touched rows)."""
        if self._dense is not None:
            if self._touched is None:
                return None
            self.grad  # noqa: B018  (fold any newer chunks)
            return RowSparseGrad(self._touched, self._dense[self._touched])
        if not self._chunks:
            return None
        if len(self._chunks) > 1:
            ids = np.concatenate([c.indices for c in self._chunks])
            rows = np.concatenate([c.rows for c in self._chunks])
            self._chunks = [coalesce_rows(ids, rows)]
        return self._chunks[0]

    @property
    def has_grad(self) -> bool:
        return self._dense is not None or bool(self._chunks)

    def accumulate(self, grad: np.ndarray) -> None:
        """Add a dense gradient of the parameter's shape."""
        if not self.requires_grad:
            return
        grad = np.asarray(grad, dtype=self.data.dtype)
        if self._chunks:
            self.grad  # noqa: B018  (fold the chunks into the dense array)
        self._dense = grad.copy() if self._dense is None else self._dense + grad
        self._touched = None

    def accumulate_rows(self, indices: np.ndarray, rows: np.ndarray, *, coalesced: bool = False) -> None:
        """Add ``rows[j]`` to row ``indices[j]`` (duplicates add up). indices (n,), rows (n, D)."""
        if not self.requires_grad:
            return
        rows = np.asarray(rows, dtype=self.data.dtype)
        if self._dense is not None:
            np.add.at(self._dense, indices, rows)
            if self._touched is not None:
                self._touched = np.union1d(self._touched, np.asarray(indices, np.int64).reshape(-1))
            return
        chunk = RowSparseGrad(np.asarray(indices, np.int64), rows) if coalesced else coalesce_rows(indices, rows)
        self._chunks.append(chunk)

    def zero_grad(self) -> None:
        self._dense, self._chunks, self._touched = None, [], None

    def __repr__(self) -> str:
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype}, requires_grad={self.requires_grad})"


M = TypeVar("M", bound="Module | None")


class Module:
    """Base class of every NumPy layer. ``layer(x)`` calls ``forward``; ``training`` starts True."""

    _parameters: dict[str, Parameter]
    _modules: dict[str, Module]

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        self.training = True

    # -- registration: assigning a Parameter or Module attribute registers it, as in torch -----
    def __setattr__(self, name: str, value: Any) -> None:
        params: dict[str, Parameter] = self.__dict__.get("_parameters", {})
        modules: dict[str, Module] = self.__dict__.get("_modules", {})
        params.pop(name, None)
        modules.pop(name, None)
        if isinstance(value, Parameter):
            params[name] = value
        elif isinstance(value, Module):
            modules[name] = value
        object.__setattr__(self, name, value)

    def register_parameter(self, name: str, param: Parameter) -> Parameter:
        setattr(self, name, param)
        return param

    def register_module(self, name: str, module: M) -> M:
        setattr(self, name, module)
        return module

    def named_parameters(self, prefix: str = "", *, trainable_only: bool = False,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """``(name, Parameter)`` pairs, this module's first, then each sub-module's (``"token.weight"``).

        As torch's ``named_parameters``: a Parameter registered under several names (a tied head,
        ``self.head = self.emb.weight``) is listed once, under its first name, unless
        ``remove_duplicate=False`` (what ``state_dict`` uses: it keeps every key, as torch does).
        """
        seen: set[int] = set()
        for name, p in self._named_all(prefix):
            if remove_duplicate:
                if id(p) in seen:
                    continue
                seen.add(id(p))
            if p.requires_grad or not trainable_only:
                yield name, p

    def _named_all(self, prefix: str) -> Iterator[tuple[str, Parameter]]:
        """Every registration, duplicates included."""
        for name, p in self._parameters.items():
            yield prefix + name, p
        for mname, m in self._modules.items():
            yield from m._named_all(prefix + mname + ".")

    def parameters(self) -> list[Parameter]:
        """The trainable parameters, each once (a tied Parameter is listed once, as in torch; frozen
        ones are left out), so an optimiser updates each exactly once per step."""
        return [p for _, p in self.named_parameters(trainable_only=True)]

    def modules(self) -> Iterator[Module]:
        yield self
        for m in self._modules.values():
            yield from m.modules()

    # -- modes and gradients -------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            m.training = bool(mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self) -> None:
        for _, p in self.named_parameters():
            p.zero_grad()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _cached(self, cache: Any, what: str = "backward") -> Any:
        if cache is None:
            raise RuntimeError(f"{type(self).__name__}.{what}() called before forward(); run forward first")
        return cache

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every parameter (frozen ones included), keyed as in docs/DESIGN.md."""
        return {name: p.data.copy() for name, p in self.named_parameters(remove_duplicate=False)}

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load arrays (NumPy arrays or torch tensors) after checking all of them.

        Raises:
            StateDictError: a missing/unexpected key (strict), or a wrong shape or dtype; nothing has
                been written when it is raised.
        """
        check_state_mapping(state)
        params = dict(self.named_parameters(remove_duplicate=False))       # every key, as state_dict
        layer = type(self).__name__
        arrays = {k: _to_numpy(k, v, params[k].dtype if k in params else None, layer) for k, v in state.items()}
        expected = {k: (p.data.shape, p.data.dtype) for k, p in params.items()}
        check_state_dict(arrays, expected, strict=strict, layer=type(self).__name__)
        for key, value in arrays.items():
            if key in params:
                params[key].data[...] = value
                params[key].zero_grad()

    def save(self, path: str | Path) -> None:
        """Write the state_dict as a safetensors file (never pickle), with this class in its metadata."""
        from tokenpos.tables.checkpoint import write_numpy

        write_numpy(self.state_dict(), path, type(self).__name__)

    def load(self, path: str | Path, strict: bool = True) -> None:
        """Load a safetensors file written by ``save`` (either backend) into this layer.

        Raises:
            StateDictError: naming the file: missing, unreadable, not safetensors, written by another
                class (its metadata), or a state that does not fit; nothing is written then.
        """
        from tokenpos.tables.checkpoint import class_names, read_checkpoint

        expected = {k: p.dtype for k, p in self.named_parameters(remove_duplicate=False)}
        self.load_state_dict(read_checkpoint(path, class_names(self), expected=expected), strict=strict)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        inner = [f"  ({n}): " + repr(m).replace("\n", "\n  ") for n, m in self._modules.items()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + ("\n" + "\n".join(inner) + "\n)" if inner else ")")


def _to_numpy(key: str, value: Any, expected: Any, layer: str) -> np.ndarray:
    """A NumPy array of a state_dict entry; a torch tensor of a dtype NumPy lacks (bfloat16, float8) is refused."""
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu()
        name = dtype_name(value.dtype)
        if not numpy_holds(name):
            raise StateDictError(numpy_dtype_message(f"state_dict for {layer}: entry", key, name, expected))
        return value.numpy()
    return np.asarray(value)
