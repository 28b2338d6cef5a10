"""The embedded engine's adapters around a transformers model: KV buffers, the forward, batch invariance.

    notion                                        code
    KV segment [layers, 2, kv_heads, tokens, D]   TOKEN_AXIS = 3 (the radix tree's token axis)
    KV buffer [layers, 2, rows, kv_heads, cap, D] kv_buffer_shape, empty_kv_buffer(template, rows, cap), copy_segments
    KV (or logits) free of NaN / inf              all_finite(t)
    transformers cache over a buffer              buffer_cache(buf, length) -> Cache of BufferLayer
    one forward (true positions, pad mask)        forward_on_buffer(model, buf, length, ...)
    batch-invariant kernels (switch per thread)   install_engine_kernels(model); batch_invariant=True
    which forward the engine runs                 plan_forward(model, batch_invariant) -> ForwardPlan

The engine runs one of three forwards (`ForwardPlan.path`):

    "native"   the lean forward (`lean.LeanForward`) on the native kernels (`native`): batch-invariant in
               every dtype and fast (weights read once per step for all rows).  Llama-family models.
    "rowwise"  transformers' forward with the switch below on: every linear runs one row at a time (one
               GEMV per token), attention per query over exactly its own valid keys (`row_starts[b]` .. its
               position).  Batch-invariant, slow (weights read once per row); any architecture.
    "sdpa"     transformers' forward with plain `F.linear` and SDPA: fast, NOT batch-invariant (a row's
               logits depend on its batch in the last bits).
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from transformers.cache_utils import Cache, DynamicLayer

from . import native
from .llama_forward import LeanForward, activation_dtype, unsupported_reason

log = logging.getLogger(__name__)

TOKEN_AXIS = 3
"""Token axis of a KV segment [layers, 2, kv_heads, tokens, head_dim]."""

ATTENTION_NAME = "forerun"
"""transformers attention implementation the engine installs: SDPA, or the exact kernel when `_EXACT.on`."""

_EXACT = threading.local()
"""Per-thread switch of the batch-invariant kernels: `on` and `row_starts` (first valid KV column per row)."""


# ============================================================================================ KV buffer
class BufferLayer(DynamicLayer):
    """A cache layer writing into a preallocated [B, H, cap, D] buffer in place (no concatenation)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, length: int) -> None:
        super().__init__()
        self.buf_k, self.buf_v, self.length = k, v, length
        self.is_initialized = True
        self.device = k.device
        self.keys, self.values = k[:, :, :length], v[:, :, :length]

    def lazy_initialization(self, key_states, value_states) -> None:  # pragma: no cover - initialized
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        q = key_states.shape[-2]
        end = self.length + q
        if end > self.buf_k.shape[-2]:
            raise RuntimeError("embedded engine: KV buffer overflow")
        self.buf_k[:, :, self.length : end] = key_states
        self.buf_v[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self.buf_k[:, :, :end], self.buf_v[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int, *args) -> tuple[int, int]:
        return self.length + query_length, 0


def buffer_cache(buf: torch.Tensor, length: int) -> Cache:
    """A transformers Cache over buf [layers, 2, B, H, cap, D] holding `length` tokens."""
    return Cache(layers=[BufferLayer(buf[l, 0], buf[l, 1], length) for l in range(buf.shape[0])])


def kv_buffer_shape(template: torch.Tensor, rows: int, cap: int) -> tuple[int, ...]:
    """[layers, 2, rows, kv_heads, cap, head_dim] of a buffer shaped like template [layers, 2, H, 0, D]."""
    L, _, H, _, D = template.shape
    return (L, 2, rows, H, cap, D)


def empty_kv_buffer(template: torch.Tensor, rows: int, cap: int) -> torch.Tensor:
    """A zeroed buffer of kv_buffer_shape(template, rows, cap) in the template's dtype."""
    return torch.zeros(kv_buffer_shape(template, rows, cap), dtype=template.dtype)


def all_finite(t: torch.Tensor) -> bool:
    """Whether every element of t is finite, read once with no temporary tensor: a NaN or an infinity makes the
    sum NaN or infinite.  (torch.isfinite(t).all() allocates two tensors of t's size: on the engine's thread,
    each costs a page fault per 4 KiB page, measured 3-14 ms per finished row of 64 tokens on a 2-core VM.)
    Conservative: a sum that overflows although every element is finite reads as False, which only KV of
    magnitude ~1e38 / t.numel() could cause."""
    return bool(torch.isfinite(t.sum()))


def copy_segments(buf: torch.Tensor, slot: int, start: int, segments: Sequence[torch.Tensor]) -> int:
    """Copy KV segments one after another into row `slot` of buf from column `start`; return the end column."""
    pos = start
    for seg in segments:
        n = seg.shape[TOKEN_AXIS]
        buf[:, :, slot, :, pos : pos + n] = seg
        pos += n
    return pos


# ============================================================================================ forward
def forward_on_buffer(model: torch.nn.Module, buf: torch.Tensor, length: int, input_ids: torch.Tensor,
                      position_ids: torch.Tensor, attention_mask: torch.Tensor | None, logits_to_keep: int,
                      row_starts: Sequence[int], *, batch_invariant: bool) -> torch.Tensor:
    """One forward over buf's cache (`length` tokens held; row b's valid KV starts at row_starts[b]);
    appends the new tokens' KV to buf and returns the last `logits_to_keep` positions' logits."""
    cache = buffer_cache(buf, length)
    _EXACT.on = batch_invariant
    _EXACT.row_starts = list(row_starts)
    try:
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    cache=cache, use_cache=True, logits_to_keep=logits_to_keep)
    finally:
        _EXACT.on = False
    return out.logits


# ============================================================================================ batch invariance
def _linear_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if getattr(_EXACT, "on", False):
        flat = x.reshape(-1, x.shape[-1])
        rows = [torch.nn.functional.linear(flat[i : i + 1], module.weight, module.bias) for i in range(flat.shape[0])]
        return torch.cat(rows).reshape(*x.shape[:-1], -1)
    return torch.nn.functional.linear(x, module.weight, module.bias)


def _exact_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Each query attends over exactly its own valid keys (no padding, no blocking): the arithmetic of a
    token never depends on the other rows, the padding or how many queries are computed together."""
    B, Hq, q, D = query.shape
    Hkv, S = key.shape[1], key.shape[2]
    groups = Hq // Hkv
    scale = scaling if scaling is not None else D**-0.5
    starts = _EXACT.row_starts
    out = torch.empty((B, q, Hq, D), dtype=query.dtype)
    for b in range(B):
        for j in range(q):
            end = S - q + j + 1
            k = key[b, :, starts[b] : end]
            v = value[b, :, starts[b] : end]
            qg = query[b, :, j].reshape(Hkv, groups, D)
            probs = torch.softmax(torch.matmul(qg, k.transpose(1, 2)) * scale, dim=-1)
            out[b, j] = torch.matmul(probs, v).reshape(Hq, D)
    return out, None


def _attention_dispatch(module, query, key, value, attention_mask, *args, **kwargs):
    if getattr(_EXACT, "on", False):
        return _exact_attention(module, query, key, value, attention_mask, *args, **kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)


def install_engine_kernels(model: torch.nn.Module) -> None:
    """Route the model's linears and attention through the switchable kernels (idempotent)."""
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, _attention_dispatch)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    model.config._attn_implementation = ATTENTION_NAME
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and not getattr(mod, "_forerun_kernels", False):
            mod.forward = functools.partial(_linear_forward, mod)
            mod._forerun_kernels = True


# ============================================================================================ forward plan
@dataclass(frozen=True)
class ForwardPlan:
    """Which forward the engine runs (see module docstring) and what it needs."""

    path: str
    """"native", "rowwise" or "sdpa"."""
    kv_dtype: torch.dtype
    """dtype of the KV buffers and the radix cache (the activation dtype)."""
    kernels: Any
    """The native kernels module (also used for the vocabulary math), or None."""
    lean: LeanForward | None
    why_not_native: str | None
    """Why the native path is not used (None when it is)."""

    @property
    def batch_invariant(self) -> bool:
        return self.path != "sdpa"


def plan_forward(model: torch.nn.Module, batch_invariant: bool | None) -> ForwardPlan:
    """The native path whenever batch_invariant is not False and the kernels and the model allow it; else
    "rowwise" when batch_invariant is True (or None with a float64 model), "sdpa" otherwise."""
    k = native.kernels()
    why = "batch_invariant=False asks for transformers' SDPA path" if batch_invariant is False else (
        native.unavailable_reason() if k is None else unsupported_reason(model))
    if why is None:
        return ForwardPlan("native", activation_dtype(model.dtype), k, LeanForward(model, k), None)
    install_engine_kernels(model)
    rowwise = batch_invariant if batch_invariant is not None else model.dtype == torch.float64
    if not rowwise:
        log.warning("embedded engine: transformers' SDPA forward in %s is NOT batch-invariant (%s): a row's "
                    "log-probs depend on its batch, so sequential and PreSTO chains may differ; they are proven "
                    "identical only with batch-invariant kernels (float64 row by row here)",
                    str(model.dtype).replace("torch.", ""), why)
    return ForwardPlan("rowwise" if rowwise else "sdpa", model.dtype, k, None, why)
