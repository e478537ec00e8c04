"""EngramMemory: the Engram module (arXiv 2601.07372) around a hashed n-gram table: context-aware gate, value
projection and a short depthwise convolution; the reference's ``Engram.forward`` (deepseek-ai/Engram
``engram_demo_v1.py``) given the same weights and hidden states.

Shapes: B batch, L length, G = hc_mult hyper-connection streams, D hidden size, E = (max_ngram_size - 1) *
n_embed_per_ngram.

    e      = HashedNgramEmbedding(ids)                                        (B, L, E)
    gate_g = sigmoid(ssqrt(<RMSNorm(k_g(e)), RMSNorm(h[:, :, g])> / sqrt(D)))  (B, L, G, 1),  ssqrt(x) = sign(x)
                                                                               * sqrt(max(|x|, 1e-6))
    v      = gate * value_proj(e)[:, :, None]                                 (B, L, G, D)
    out    = v + SiLU(causal depthwise conv(RMSNorm_g(v), kernel_size, dilation max_ngram_size))

Submodules are named as the reference's (``short_conv.conv``, ``short_conv.norms``, ``value_proj``, ``key_projs``,
``norm1``, ``norm2``), the table as ``multi_head_embedding.weight`` (the reference's
``multi_head_embedding.embedding.weight``: :meth:`EngramMemory.load_reference_state_dict` renames it).

Beyond the reference (which takes whole (B, L) sequences only):

- Packed documents: hidden_states (T, G, D), ids (T,), ``cu_seqlens`` (S + 1,): neither the n-grams nor the
  convolution reach into the previous document; each token's output equals its document's run alone.
- Decoding: an :class:`EngramCache` (``EngramMemory.new_cache(N)``) holds, per sequence, the last C =
  max_ngram_size - 1 ids and the last W = (kernel_size - 1) * max_ngram_size normalised values (the
  convolution's input); a forward given ``cache=`` reads it as what came before the call's tokens and updates it
  in place, as HF's caches are (one token or a chunk per call, (B, L) or packed); the outputs of successive calls
  equal the whole sequence's forward.

Shapes (decoding): S documents (packed) or B sequences = N, C = max_ngram_size - 1, W = (kernel_size - 1) *
max_ngram_size; cache.ids (N, C) int64, cache.conv (N, W, G * D).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tokenpos.tables.checks.validation import check_int, check_positive_int
from tokenpos.tables.errors import ConfigError, DtypeError
from tokenpos.torch._checks import check_float_tensor
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.ngram import HashedNgramEmbedding
from tokenpos.torch.packing import check_cu_seqlens_tensor


class EngramCache:
    """The decoding state of one :class:`EngramMemory` for N sequences (or N packed documents): what came
    before the next call's tokens. Made by :meth:`EngramMemory.new_cache`; a forward given it reads it and
    then replaces its two tensors by the updated ones (HF's convention: one cache object passed to every
    step, updated in place by the layer). The tensors are replaced, never written into, so a backward
    through several chunks (the state carries the previous chunk's graph) works; detach them
    (:meth:`detach_`) to cut it.

    Attributes:
        ids: (N, C) int64, C = max_ngram_size - 1: each sequence's last C ids (its ``pad_id`` where it has
            fewer: the reference pads the n-grams of a sequence's first tokens with it).
        conv: (N, W, G * D), W = (kernel_size - 1) * max_ngram_size: each sequence's last W normalised values,
            the short convolution's input (zeros where it has fewer: the convolution's padding).
    """

    def __init__(self, ids: torch.Tensor, conv: torch.Tensor) -> None:
        self.ids = ids
        self.conv = conv

    @property
    def batch_size(self) -> int:
        """N, the sequences (or packed documents) it holds."""
        return int(self.ids.shape[0])

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Keep the sequences ``beam_idx`` (M,) int64 picks, in its order (beam search; HF's name): N -> M."""
        self.ids = self.ids.index_select(0, beam_idx.to(self.ids.device))
        self.conv = self.conv.index_select(0, beam_idx.to(self.conv.device))

    def detach_(self) -> EngramCache:
        """Cut the state off the graph of the calls that made it (truncated backpropagation)."""
        self.ids, self.conv = self.ids.detach(), self.conv.detach()
        return self

    def __repr__(self) -> str:
        return f"EngramCache(batch_size={self.batch_size}, ids={tuple(self.ids.shape)}, conv={tuple(self.conv.shape)})"


def _stream(old: torch.Tensor, new: torch.Tensor, cu: torch.Tensor, doc: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed documents each after its own state: ``old`` (S, K, ...), ``new`` (T, ...) of S documents (``cu``
    (S + 1,) int64, ``doc`` (T,) each token's document) -> (stream (S * K + T, ...), the last K rows of each
    document's [old, new] (S, K, ...)). Document s's [old_s, new_s] sits at rows [cu[s] + s * K, cu[s + 1] +
    (s + 1) * K); token t at t + (doc[t] + 1) * K. Tensor ops of sizes known on the host: no host sync."""
    S, K = old.shape[0], old.shape[1]
    T = new.shape[0]
    dev = new.device
    ks = torch.arange(K, device=dev)
    first = cu[:-1] + torch.arange(S, device=dev) * K                                   # (S,) each document's row 0
    dest = torch.cat([(first[:, None] + ks).reshape(-1), torch.arange(T, device=dev) + (doc + 1) * K])
    src = torch.cat([old.reshape(S * K, *old.shape[2:]), new])
    stream = src.new_zeros(src.shape).index_copy(0, dest, src)                        # a permutation of src
    last = (cu[1:] + torch.arange(S, device=dev) * K)[:, None] + ks                   # (S, K)
    return stream, stream[last.reshape(-1)].reshape(old.shape)


class ShortConv(nn.Module):
    """RMSNorm per stream, then a causal depthwise Conv1d over the G * D channels and SiLU: (B, L, G, D) ->
    (B, L, G, D)."""

    def __init__(self, hidden_size: int, kernel_size: int, dilation: int, hc_mult: int, norm_eps: float = 1e-5,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        channels = hidden_size * hc_mult
        self.hc_mult = hc_mult
        self.window = (kernel_size - 1) * dilation                    # W: the inputs before a token it reads
        self.conv = nn.Conv1d(channels, channels, kernel_size, groups=channels, bias=False,
                              padding=(kernel_size - 1) * dilation, dilation=dilation, device=device, dtype=dtype)
        self.norms = nn.ModuleList([nn.RMSNorm(hidden_size, eps=norm_eps, device=device, dtype=dtype)
                                    for _ in range(hc_mult)])
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, G, C = x.shape
        x_norm = torch.cat([self.norms[i](x[:, :, i, :]) for i in range(G)], dim=-1)   # (B, T, G * C)
        y = self.conv(x_norm.transpose(1, 2))[..., :T]                                  # (B, G * C, T): causal
        return self.act_fn(y).transpose(1, 2).view(B, T, G, C).contiguous()

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        """The convolution's input: (..., G, C) -> (..., G * C), each stream RMSNorm'd."""
        return torch.cat([self.norms[i](x[..., i, :]) for i in range(x.shape[-2])], dim=-1)

    def after(self, x_ext: torch.Tensor) -> torch.Tensor:
        """SiLU(conv) of the rows past the first W: x_ext (N, W + L, G * C) normalised -> (N, L, G * C) (the
        same convolution without padding: every output reads W rows back, all inside x_ext)."""
        conv = self.conv
        if x_ext.shape[1] <= self.window:                                  # no row past the first W
            return x_ext.new_zeros(x_ext.shape[0], 0, x_ext.shape[2])
        y = F.conv1d(x_ext.transpose(1, 2), conv.weight, None, 1, 0, conv.dilation, conv.groups)   # (N, G*C, L)
        return self.act_fn(y).transpose(1, 2)


class EngramMemory(TokenposModule):
    """The Engram module of one layer.

    Args:
        hidden_size: D. hc_mult: G, the hyper-connection streams (1 or more; the reference uses 4).
        kernel_size: the short convolution's width (dilation max_ngram_size).
        engram_vocab_size, max_ngram_size, n_embed_per_ngram, n_head_per_ngram, layer_id, layer_ids, pad_id,
            seed, compress: the hashed table's settings (:class:`HashedNgramEmbedding`).
        device, dtype: factory kwargs. init_seed: the initial weights: the table's as the NumPy layer draws them,
            the linear, norm and conv layers' as torch's own do from ``torch.manual_seed(init_seed)`` (torch's
            global generator left as it was); None: torch's generator.

    Shape:
        forward: hidden_states (B, L, G, D), ids (B, L) -> (B, L, G, D); packed: hidden_states (T, G, D), ids (T,),
        ``cu_seqlens`` (S + 1,) -> (T, G, D); ``cache``: an :class:`EngramCache` of B (or S) sequences, read and
        updated in place.
    """

    def __init__(self, hidden_size: int, *, hc_mult: int = 4, kernel_size: int = 4, engram_vocab_size: Any,
                 max_ngram_size: int, n_embed_per_ngram: int, n_head_per_ngram: int, layer_id: int, layer_ids: Any,
                 pad_id: int, seed: int, compress: Any, device: Any = None, dtype: Any = None,
                 init_seed: int | None = None) -> None:
        super().__init__()
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.hc_mult = check_positive_int("hc_mult", hc_mult)
        kernel_size = check_int("kernel_size", kernel_size, minimum=1)
        self.kernel_size = kernel_size
        self.multi_head_embedding = HashedNgramEmbedding(
            engram_vocab_size=engram_vocab_size, max_ngram_size=max_ngram_size, n_embed_per_ngram=n_embed_per_ngram,
            n_head_per_ngram=n_head_per_ngram, layer_id=layer_id, layer_ids=layer_ids, pad_id=pad_id, seed=seed,
            compress=compress, device=device, dtype=dtype, init_seed=init_seed)
        E, D, G = self.multi_head_embedding.out_dim, self.hidden_size, self.hc_mult
        kw: dict[str, Any] = dict(device=device, dtype=self.multi_head_embedding.weight.dtype)
        with torch.random.fork_rng(devices=[], enabled=init_seed is not None):
            if init_seed is not None:
                torch.manual_seed(init_seed)
            self.short_conv = ShortConv(D, kernel_size, max_ngram_size, G, **kw)
            self.value_proj = nn.Linear(E, D, **kw)
            self.key_projs = nn.ModuleList([nn.Linear(E, D, **kw) for _ in range(G)])
            self.norm1 = nn.ModuleList([nn.RMSNorm(D, **kw) for _ in range(G)])
            self.norm2 = nn.ModuleList([nn.RMSNorm(D, **kw) for _ in range(G)])
        self.pad_id = int(pad_id)                                 # checked by the table's spec: in compress's domain

    def new_cache(self, batch_size: int) -> EngramCache:
        """An empty decoding state for ``batch_size`` sequences (or packed documents), on the module's device:
        ids (N, C) all ``pad_id``, conv (N, W, G * D) zeros of the convolution's dtype (what the start of a
        sequence reads)."""
        n = check_int("batch_size", batch_size, minimum=0)
        w = self.short_conv.conv.weight
        C = self.multi_head_embedding.spec.max_ngram_size - 1
        ids = torch.full((n, C), self.pad_id, dtype=torch.int64, device=w.device)
        return EngramCache(ids, w.new_zeros(n, self.short_conv.window, self.hc_mult * self.hidden_size))

    def _check_cache(self, cache: Any, n: int, what: str) -> EngramCache:
        """``cache``: an EngramCache of ``n`` sequences with this module's widths, dtype and device."""
        if not isinstance(cache, EngramCache):
            raise ConfigError(f"cache must be an EngramCache (EngramMemory.new_cache(batch_size)), got "
                              f"{type(cache).__name__}")
        w = self.short_conv.conv.weight
        C = self.multi_head_embedding.spec.max_ngram_size - 1
        want_ids, want_conv = (n, C), (n, self.short_conv.window, self.hc_mult * self.hidden_size)
        ids, conv = cache.ids, cache.conv
        if not (isinstance(ids, torch.Tensor) and isinstance(conv, torch.Tensor)):
            raise ConfigError(f"cache.ids and cache.conv must be tensors, got {type(ids).__name__} and "
                              f"{type(conv).__name__}")
        if tuple(ids.shape) != want_ids or tuple(conv.shape) != want_conv:
            raise ConfigError(f"cache holds ids {tuple(ids.shape)} and conv {tuple(conv.shape)}; expected ids "
                              f"{want_ids} and conv {want_conv} for the call's {n} {what} (EngramMemory.new_cache("
                              f"{n}))")
        if ids.dtype != torch.int64 or conv.dtype != w.dtype:
            raise DtypeError(f"cache.ids must be int64 and cache.conv {w.dtype} (the convolution's dtype), got "
                             f"{ids.dtype} and {conv.dtype}")
        if ids.device != w.device or conv.device != w.device:
            raise ConfigError(f"cache is on {ids.device} / {conv.device}; expected the module's device {w.device}")
        return cache

    def forward(self, hidden_states: torch.Tensor, ids: Any, *, cu_seqlens: Any = None,
                cache: EngramCache | None = None) -> torch.Tensor:
        """hidden_states (B, L, G, D), ids (B, L) -> (B, L, G, D); packed: hidden_states (T, G, D), ids (T,),
        ``cu_seqlens`` (S + 1,) -> (T, G, D), no n-gram or convolution tap crossing a document's start.
        ``cache`` (an :class:`EngramCache` of B or S sequences): what came before each sequence; updated in
        place to end with this call's tokens. Every input is checked before anything changes: bad ids raise
        TokenIdError naming the value, bad shapes ConfigError naming them (the cache is then left as it was)."""
        h = check_float_tensor("hidden_states", hidden_states)
        G, D = self.hc_mult, self.hidden_size
        packed = cu_seqlens is not None
        if packed:
            if h.dim() != 3 or tuple(h.shape[1:]) != (G, D):
                raise ConfigError(f"packed hidden_states (with cu_seqlens) must be (T, {G}, {D}), got "
                                  f"{tuple(h.shape)}")
            cu = check_cu_seqlens_tensor(cu_seqlens, h.shape[0], device=self.short_conv.conv.weight.device)
            n = cu.shape[0] - 1
        elif h.dim() != 4 or h.shape[2:] != (G, D):
            raise ConfigError(f"hidden_states must be (B, L, {G}, {D}), got {tuple(h.shape)}")
        else:
            n = h.shape[0]
        if cache is not None:
            self._check_cache(cache, n, "documents (cu_seqlens)" if packed else "sequences (hidden_states' B)")
        context = None if cache is None else cache.ids
        if packed:
            # (T, E); ids of another length than hidden_states' T: PositionError (cu_seqlens must end at T)
            e = self.multi_head_embedding(ids, cu_seqlens=cu, context=context)
        else:
            e = self.multi_head_embedding(ids, context=context)                   # (B, L, E)
            if e.shape[:2] != h.shape[:2]:
                raise ConfigError(f"ids must be (B, L) = {tuple(h.shape[:2])} (hidden_states' first two dims), "
                                  f"got {tuple(e.shape[:2])}")
        value = self._value(h, e)                                                 # (..., G, D)
        if not packed and cache is None and h.shape[1]:
            return value + self.short_conv(value)                                # the reference's own path
        x = self.short_conv.normed(value)                                         # (..., G * D)
        old = cache.conv if cache is not None else x.new_zeros(n, self.short_conv.window, G * D)
        if packed:
            y, tail, id_tail = self._packed_conv(x, old, cu, ids, context)
        else:
            x_ext = torch.cat([old, x], dim=1)                                    # (B, W + L, G * D)
            y = self.short_conv.after(x_ext)                                      # (B, L, G * D)
            L = x.shape[1]
            tail = x_ext[:, L:]                                                   # (B, W, G * D): the last W
            id_tail = None if context is None else torch.cat(
                [context, torch.as_tensor(ids, device=context.device).long()], dim=1)[:, L:]
        out = value + y.unflatten(-1, (G, D))
        if cache is not None and id_tail is not None:                            # nothing failed: update
            cache.ids, cache.conv = id_tail, tail
        return out

    def _value(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """The gated value: h (..., G, D), e (..., E) -> (..., G, D)."""
        gates = []
        for g in range(self.hc_mult):
            key = self.norm1[g](self.key_projs[g](e))                              # (..., D)
            query = self.norm2[g](h[..., g, :])                                    # (..., D)
            gate = (key * query).sum(dim=-1) / math.sqrt(self.hidden_size)         # (...)
            gate = gate.abs().clamp_min(1e-6).sqrt() * gate.sign()
            gates.append(gate.sigmoid().unsqueeze(-1))                             # (..., 1)
        return torch.stack(gates, dim=-2) * self.value_proj(e).unsqueeze(-2)      # (..., G, D)

    def _packed_conv(self, x: torch.Tensor, old: torch.Tensor, cu: torch.Tensor, ids: Any, context: Any
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x (T, G * D) normalised, old (S, W, G * D) -> (SiLU(conv) (T, G * D), the new conv state (S, W, G * D),
        the new id state (S, C) or None without ``context`` (S, C)): each document's tokens after its own state."""
        T, S, W = x.shape[0], old.shape[0], old.shape[1]
        cu = cu.long()
        doc = torch.searchsorted(cu[1:], torch.arange(T, device=x.device), right=True)   # (T,) each token's document
        if S == 0:
            return x, old, context
        stream, tail = _stream(old, x, cu, doc)                                   # (S * W + T, G * D), (S, W, G * D)
        y = self.short_conv.after(stream[None])[0]                                # (S * W + T - W, G * D)
        y = y[torch.arange(T, device=x.device) + doc * W]                         # token t: row t + doc * W
        id_tail = None
        if context is not None:
            _, id_tail = _stream(context, torch.as_tensor(ids, device=context.device).long(), cu, doc)
        return y, tail, id_tail

    def load_reference_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> Any:
        """Load the reference ``Engram``'s state_dict: its ``multi_head_embedding.embedding.weight`` is this
        module's ``multi_head_embedding.weight``; its ``multi_head_embedding.offsets`` buffer (this module
        computes the same offsets) is checked, then dropped."""
        state = dict(state)
        offsets = state.pop("multi_head_embedding.offsets", None)
        if offsets is not None and not np.array_equal(np.asarray(offsets.cpu() if hasattr(offsets, "cpu")
                                                                 else offsets),
                                                      self.multi_head_embedding.spec.offsets):
            raise ConfigError("the reference's multi_head_embedding.offsets differ from this module's: the hash "
                              "settings (engram_vocab_size, heads, layer_ids) do not match")
        if "multi_head_embedding.embedding.weight" in state:
            state["multi_head_embedding.weight"] = state.pop("multi_head_embedding.embedding.weight")
        return self.load_state_dict(state, strict=strict)
