"""The lean forward: the engine's own layer loop over a Llama-family model's weights, on the native kernels.

One forward serves prefill (one row, T tokens) and decode (B rows, one token each) with the same per-token
arithmetic, so a token's KV and logits are the same bits whether it was computed in a prefill, a chunk of
one, a decode step, or with any other rows beside it.  The weights are read once per call for all rows.

    notion                                     code
    h (residual stream, float32 or float64)    `h` [tokens, hidden]; bf16/fp16 weights are widened in the dot
    RMSNorm(h) · w                             kernels.rmsnorm (the residual add fused in)
    q | k | v = x [Wq | Wk | Wv]^T (+ b)       kernels.linear(x, pack([Wq, Wk, Wv]), b)
    RoPE, KV append, softmax(q k^T / √d) v     kernels.attention over the engine's KV buffer
    silu(x Wg^T) ⊙ (x Wu^T), then W_down       kernels.linear_silu(x, pack_pairs(Wg, Wu)) -> kernels.linear
    logits of the last `keep` positions         kernels.linear(norm(h), pack([W_lm_head]))

The loop over the layers runs natively (`kernels.layer_stack`: the same kernel calls in the same order, with
the GIL released): a decode step makes a handful of Python calls instead of ~8 per layer.

Activations, KV and logits are float32 for float32 / bfloat16 / float16 weights (weight-only reduced
precision: the bytes read per step halve, every sum stays float32), float64 for float64 weights.

Every matrix a call reads is copied once, at load, into the kernels' packed layout (`kernels.pack`: panels of
16 output features stored input by input, one sequential run per call, in huge-page memory): a decode step
streams all weights, and each step of an output's chain reads the 16 weights it needs as one vector.  The
model's own parameters stay as they are (transformers' forward, used by benchmarks and by non-Llama models,
keeps working), so the native path holds the weights twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

_ROPE_CHUNK = 1024
"""Positions per cos/sin table chunk: every chunk is computed by a call of the same shape, so a position's
values never depend on which other positions were asked for."""

_LLAMA_TYPES = ("llama", "mistral", "qwen2")


def activation_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    """Activation / KV / logits dtype of the lean forward for a model's weight dtype."""
    return torch.float64 if weight_dtype == torch.float64 else torch.float32


def unsupported_reason(model: Any) -> str | None:
    """Why the lean forward cannot run `model` (None when it can)."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in _LLAMA_TYPES:
        return f"model type {getattr(cfg, 'model_type', None)!r} is not one of {_LLAMA_TYPES}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} is not silu"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "sliding-window attention"
    if any(getattr(mod, "bias", None) is not None for layer in model.model.layers
           for mod in (layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)):
        return "biased o_proj / MLP projections"
    if model.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        return f"weight dtype {model.dtype}"
    return None


_NO_SEGMENTS = torch.empty(0, dtype=torch.long)


def segment_table(segments: Sequence[Sequence[torch.Tensor]] | None, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(seg [S, 2] = (address, tokens), seg_off [B + 1]) of each row's prefix segments, for the attention
    kernel; empty tensors when no row has any.  The caller keeps the tensors alive during the call.

    The engine does so by construction: both callers (`prefill.compute_prompt_kv`, `EmbeddedEngine._step` via
    `RunningBatch.prefixes`) pass lists that hold the tensors themselves, and `LeanForward.forward` holds those lists
    until its native call returns.  The radix tree changes only on the engine thread, between forwards, and an
    eviction or a split drops the tree's reference to a tensor, never the list's, nor writes into it (a split
    clones; a row locks its prefix's nodes)."""
    if not segments or not any(len(row) for row in segments):
        return _NO_SEGMENTS, _NO_SEGMENTS
    table, off = [], [0]
    for row in segments:
        for t in row:
            if not t.is_contiguous() or t.dtype != dtype or t.dim() != 5:
                raise ValueError("KV segments must be contiguous [layers, 2, H, tokens, D] tensors of the KV dtype")
            table.append((t.data_ptr(), t.shape[3]))
        off.append(len(table))
    return torch.tensor(table, dtype=torch.long).reshape(-1, 2), torch.tensor(off, dtype=torch.long)


@dataclass(frozen=True)
class _Layer:
    ln1: torch.Tensor
    qkv: Any  # kernels.Packed
    qkv_bias: torch.Tensor | None
    o: Any
    ln2: torch.Tensor
    gate_up: Any
    down: Any


class RopeTable:
    """cos / sin of every position from the model's own rotary embedding, computed in fixed-shape chunks."""

    def __init__(self, rotary: Any, dtype: torch.dtype) -> None:
        self.rotary, self.dtype = rotary, dtype
        self.cos = torch.empty((0, 0), dtype=dtype)
        self.sin = torch.empty((0, 0), dtype=dtype)

    def _grow(self, upto: int) -> None:
        cos, sin = [self.cos], [self.sin]
        start = self.cos.shape[0]
        probe = torch.empty((1,), dtype=self.dtype)
        while start < upto:
            pos = torch.arange(start, start + _ROPE_CHUNK, dtype=torch.long).unsqueeze(0)
            c, s = self.rotary(probe, pos)
            cos.append(c[0].to(self.dtype))
            sin.append(s[0].to(self.dtype))
            start += _ROPE_CHUNK
        self.cos = torch.cat([t for t in cos if t.numel()])
        self.sin = torch.cat([t for t in sin if t.numel()])

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [len(positions), head_dim] for a flat int64 tensor of positions."""
        top = int(positions.max()) + 1
        if top > self.cos.shape[0]:
            self._grow(top)
        return self.cos.index_select(0, positions).contiguous(), self.sin.index_select(0, positions).contiguous()


class LeanForward:
    """A Llama-family model's forward over the engine's KV buffer (see module docstring)."""

    def __init__(self, model: Any, kernels: Any) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"lean forward: {reason}")
        self.k = kernels
        cfg, body = model.config, model.model
        self.dtype = activation_dtype(model.dtype)
        self.hidden = int(cfg.hidden_size)
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or self.hidden // self.num_heads)
        self.scale = float(body.layers[0].self_attn.scaling)
        self.eps = float(cfg.rms_norm_eps)
        self.embed = body.embed_tokens.weight
        self.lm_head = kernels.pack([model.lm_head.weight.detach().contiguous()])
        self.final_norm = self._vec(body.norm.weight)
        self.layers = [self._layer(layer) for layer in body.layers]
        per_layer = lambda field: [getattr(layer, field) for layer in self.layers]
        self.stack = kernels.layer_stack(per_layer("qkv"), per_layer("qkv_bias"), per_layer("o"),
                                         per_layer("gate_up"), per_layer("down"), per_layer("ln1"),
                                         per_layer("ln2"), self.final_norm, self.eps, self.scale, self.num_heads,
                                         self.num_kv_heads)
        """The layer loop, run natively (kernels.LayerStack: the calls of the module docstring, in that order)."""
        self.rope = RopeTable(body.rotary_emb, self.dtype)
        packed = [self.lm_head] + [w for L in self.layers for w in (L.qkv, L.o, L.gate_up, L.down)]
        self.weight_bytes = sum(int(p.nbytes) for p in packed)
        """Bytes of packed weights one decode step reads (every matrix once, the embedding row aside)."""
        self.weight_elements = sum(int(p.N) * int(p.K) for p in packed)
        """Multiply-adds per row of one step's matrix products."""

    def _vec(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(self.dtype).contiguous()

    def _layer(self, layer: Any) -> _Layer:
        at, mlp = layer.self_attn, layer.mlp
        mats = lambda *mods: self.k.pack([m.weight.detach().contiguous() for m in mods])
        biases = [getattr(m, "bias", None) for m in (at.q_proj, at.k_proj, at.v_proj)]
        qkv_bias = None
        if any(b is not None for b in biases):
            qkv_bias = torch.cat([self._vec(b) if b is not None else torch.zeros(m.weight.shape[0], dtype=self.dtype)
                                  for b, m in zip(biases, (at.q_proj, at.k_proj, at.v_proj))])
        return _Layer(ln1=self._vec(layer.input_layernorm.weight), qkv=mats(at.q_proj, at.k_proj, at.v_proj),
                      qkv_bias=qkv_bias, o=mats(at.o_proj), ln2=self._vec(layer.post_attention_layernorm.weight),
                      gate_up=self.k.pack_pairs(mlp.gate_proj.weight.detach().contiguous(),
                                                mlp.up_proj.weight.detach().contiguous()),
                      down=mats(mlp.down_proj))

    def forward(self, buf: torch.Tensor, length: int, input_ids: torch.Tensor, position_ids: torch.Tensor,
                logits_to_keep: int, row_starts: Sequence[int],
                segments: Sequence[Sequence[torch.Tensor]] | None = None) -> torch.Tensor:
        """Logits [B, keep, V] of the last `logits_to_keep` of T new tokens per row; appends their KV to
        buf [layers, 2, B, H, cap, D] at columns length .. length+T-1.  Row b's keys: its prefix `segments[b]`
        (contiguous [layers, 2, H, tokens, D] KV tensors, read in place), then buf columns row_starts[b] ..."""
        k = self.k
        B, T = input_ids.shape
        seg, seg_off = segment_table(segments, self.dtype)
        h = torch.nn.functional.embedding(input_ids.reshape(-1), self.embed).to(self.dtype).contiguous()
        cos, sin = self.rope.lookup(position_ids.reshape(-1))
        starts = torch.tensor(list(row_starts), dtype=torch.long)
        y = self.stack.forward(h, cos, sin, buf, starts, length, T, seg, seg_off)
        keep = min(max(int(logits_to_keep), 1), T)
        last = y.view(B, T, -1)[:, T - keep:].reshape(B * keep, -1).contiguous()
        return k.linear(last, self.lm_head, None).view(B, keep, -1)
