"""The embedded CPU engine: transformers forward + radix KV cache + continuous batching.

Requests arrive from many threads (the fork branches of an sgl program) and are gathered into one batch
(`EngineConfig.batch_window_ms`).  Each request reuses its longest cached prefix, prefills the rest, and
then joins the running decode batch: one batched forward per step over left-padded KV (zeros in the
attention mask over the pads, explicit true positions), new arrivals join between steps.

Per generated token y_t at absolute position p the engine returns

    paper / notion                        code
    log p0(y_t | y_<t)  (raw logits)      output_logp0     meta_info["output_token_logp0"]
    log q_τ(y_t | y_<t) (sampled from)    output_logq      meta_info["output_token_logprobs"][t][0]
    H(p0(· | y_<t)), natural log          output_entropy   meta_info["output_token_entropy"]
    top-k of p0                           meta_info["output_top_logprobs"]
    sampling noise u(seed, p)             sampling_uniform(seed, p)

q_τ is the full-vocabulary distribution softmax(logits / τ) restricted by top-k / top-p when (and only
when) the request asks for it; τ = 0 is argmax (q is the point mass, log q = 0).  The token is drawn by
inverse-CDF sampling (token-id order) with ONE uniform u from a counter-based stream keyed by
(seed, absolute position) - so the drawn tokens never depend on batch composition or scheduling.

Scoring (`max_new_tokens=0`, `return_logprob`, `logprob_start_len=s`): `input_token_logprobs` follows
SGLang's shift exactly: entries cover prompt positions s..n-1, entry 0 is ``[None, x_s, text]`` (always,
whatever s is) and entry j >= 1 is ``[log p0(x_{s+j} | x_<s+j), x_{s+j}, text]``.  To score tokens from
position P, pass s = P-1 and read entries [1:].  `input_token_entropy[j]` is H(p0(· | x_<s+j)) (None at 0).
A request asking for prompt logprobs from s reuses cached KV only up to s (like SGLang).

Stopping: EOS (unless `ignore_eos`) and `stop_token_ids` end a generation and are kept in output_ids;
a stop string ends it and the text is cut before the string (output_ids keep the token that completed it,
as SGLang does); before `min_new_tokens` tokens none of these stop a request (nothing is masked, so q_τ is
unchanged).  finish_reason is {"type": "length", "length": n} or {"type": "stop", "matched": id | str}.

Priorities: requests with priority < 0 (background pre-positioning) run in a separate batch that only
steps when no normal request is queued or running.  `abort(rid)` finishes a request (queued or running)
with finish_reason {"type": "abort"}; `generate` returns that output (it does not raise).
"""

from __future__ import annotations

import functools
import itertools
import math
import secrets
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer

from .models import LoadedModel, load_model
from ..protocol import EngineError, GenerateOutput, SamplingParams
from .radix_cache import RadixCache, RadixNode

TOKEN_AXIS = 3
"""Token axis of a KV segment [layers, 2, kv_heads, tokens, head_dim]."""


# ============================================================================================ config
@dataclass(frozen=True)
class EngineConfig:
    """Embedded engine settings."""

    max_total_tokens: int = 32768
    """Token budget of the radix KV pool (cached prefixes); unlocked LRU leaves are evicted beyond it."""
    max_batch_size: int = 64
    """Most requests decoded together in one batched forward."""
    batch_window_ms: float = 2.0
    """Gathering window: an idle engine waits this long after the first arrival for more requests."""
    num_threads: int | None = None
    """torch intra-op threads of the engine's worker thread (per-thread setting; the caller's threads are
    untouched).  None: 1 for small models (hidden size < 512: their ops are too small to gain from a
    second thread, which on a busy machine mostly waits for a time slice), else torch's default."""
    request_timeout_s: float | None = None
    """A blocking `generate` raises EngineError after this long (None: wait forever)."""
    batch_invariant: bool | None = None
    """Compute every token row by row (one GEMV per linear, attention per query over exactly its own keys)
    so results are bit-identical whatever the batch, padding, prefill chunking or cache state.  Slow; meant
    for the float64 tiny model in tests.  None (default): on for float64 models, off otherwise."""

    def __post_init__(self) -> None:
        if self.max_total_tokens <= 0:
            raise ValueError(f"max_total_tokens must be > 0, got {self.max_total_tokens}")
        if self.max_batch_size <= 0:
            raise ValueError(f"max_batch_size must be > 0, got {self.max_batch_size}")
        if not (self.batch_window_ms >= 0 and math.isfinite(self.batch_window_ms)):
            raise ValueError(f"batch_window_ms must be a finite number >= 0, got {self.batch_window_ms}")
        if self.num_threads is not None and self.num_threads <= 0:
            raise ValueError(f"num_threads must be > 0 or None, got {self.num_threads}")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0 or None, got {self.request_timeout_s}")


# ============================================================================================ sampling
_MASK64 = (1 << 64) - 1


def sampling_uniform(seed: int, position: int) -> float:
    """u ~ U[0, 1) from a counter-based stream keyed by (seed, absolute position); 53 random bits."""
    s = int(seed) & _MASK64
    state = np.random.SeedSequence([s & 0xFFFFFFFF, s >> 32, int(position)]).generate_state(2, np.uint32)
    bits = (int(state[0]) << 21) ^ (int(state[1]) >> 11)
    return (bits & ((1 << 53) - 1)) / float(1 << 53)


def sampling_log_probs(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """log q_τ over the full vocabulary: softmax(logits / τ), then top-k, then top-p (τ > 0; float64 in/out).

    top-k keeps every token whose scaled logit is >= the k-th largest (ties kept); top-p keeps the
    smallest prefix of tokens sorted by probability whose mass reaches top_p.  Removed tokens get -inf.
    """
    if not temperature > 0:
        raise ValueError(f"sampling_log_probs needs temperature > 0, got {temperature}")
    z = logits / temperature
    if 0 < top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    logq = torch.log_softmax(z, dim=-1)
    if top_p < 1.0:
        probs = logq.exp()
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logq = torch.log_softmax(z.masked_fill(drop, float("-inf")), dim=-1)
    return logq


def sample_inverse_cdf(logq: torch.Tensor, u: float) -> int:
    """The token y with CDF(y-1) <= u·CDF(V-1) < CDF(y), token-id order (never a zero-probability token)."""
    cdf = torch.cumsum(logq.exp(), dim=-1)
    x = torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype)
    idx = int(torch.searchsorted(cdf, x, right=True)[0])
    idx = min(idx, cdf.shape[-1] - 1)
    while idx > 0 and not torch.isfinite(logq[idx]):  # only when u·total rounds to the very end
        idx -= 1
    return idx


def entropy_from_log_probs(logp: torch.Tensor) -> torch.Tensor:
    """H(p) = -Σ p log p, natural log, over the last axis (0·log 0 = 0)."""
    return torch.special.entr(logp.exp()).sum(dim=-1)


# ============================================================================================ KV buffer
class _BufferLayer(DynamicLayer):
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


def _buffer_cache(buf: torch.Tensor, length: int) -> Cache:
    """A transformers Cache over buf [layers, 2, B, H, cap, D] holding `length` tokens."""
    return Cache(layers=[_BufferLayer(buf[l, 0], buf[l, 1], length) for l in range(buf.shape[0])])


# ============================================================================================ batch invariance
_EXACT = threading.local()
"""Per-thread switch of the batch-invariant kernels: `on` and `row_starts` (first valid KV column per row)."""

ATTENTION_NAME = "forerun"
"""transformers attention implementation the engine installs: SDPA, or the exact kernel when `_EXACT.on`."""


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


# ============================================================================================ requests
@dataclass(eq=False)
class _Request:
    rid: str
    input_ids: tuple[int, ...]
    params: SamplingParams
    priority: int
    seed: int
    mode: str  # "generate" | "logits" | "pin"
    submitted: float = field(default_factory=time.perf_counter)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    aborted: bool = False
    # runtime
    node: RadixNode | None = None
    cached_tokens: int = 0
    kv_len: int = 0
    next_token: int = 0
    output_ids: list[int] = field(default_factory=list)
    logq: list[float] = field(default_factory=list)
    logp0: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    logq_by_temperature: list[list[float]] = field(default_factory=list)
    top: list[list[list[Any]]] = field(default_factory=list)
    input_logp0: list[float | None] = field(default_factory=list)
    input_entropy: list[float | None] = field(default_factory=list)
    input_top: list[Any] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    stop_text_cut: int | None = None

    @property
    def input_logprob_start(self) -> int:
        p = self.params
        return p.logprob_start_len if (p.return_logprob and p.logprob_start_len >= 0) else -1


class _Batch:
    """Running decode rows sharing one left-padded KV buffer [layers, 2, row_capacity, H, cap, D].

    Row i of `rows` lives in buffer slot i and holds its KV in columns [end - kv_len, end); a step appends
    column `end` for every row.  Rows join in place when a free slot and enough columns are there (else
    the buffer is rebuilt with room to grow), and leave by moving the last row into their slot, so a
    join or a finish copies one row, not the whole batch.
    """

    def __init__(self, template: torch.Tensor, max_rows: int) -> None:
        self.template = template
        self.max_rows = max_rows
        self.rows: list[_Request] = []
        self.buf: torch.Tensor | None = None
        self.end = 0
        self.rebuilds = 0

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def active(self) -> torch.Tensor:
        """The occupied slots' buffer [layers, 2, B, H, cap, D] (a view)."""
        assert self.buf is not None
        return self.buf[:, :, : len(self.rows)]

    @staticmethod
    def _remaining(r: _Request) -> int:
        return r.params.max_new_tokens - len(r.output_ids)

    def rebuild(self, keep: Sequence[_Request], add: Sequence[tuple[_Request, Sequence[torch.Tensor]]]) -> None:
        """New buffer holding `keep` (copied from the old buffer) and `add` (copied from KV segments)."""
        rows = list(keep) + [r for r, _ in add]
        self.rebuilds += 1
        if not rows:
            self.rows, self.buf, self.end = [], None, 0
            return
        end = max(r.kv_len for r in rows)
        cap = end + max(self._remaining(r) for r in rows) + 1
        row_cap = min(max(len(rows), self.max_rows), len(rows) + max(4, len(rows) // 2))
        L, _, H, _, D = self.template.shape
        buf = torch.zeros((L, 2, row_cap, H, cap, D), dtype=self.template.dtype)
        if keep:
            assert self.buf is not None
            index = {id(r): i for i, r in enumerate(self.rows)}
            for i, r in enumerate(keep):
                j = index[id(r)]
                if r.kv_len:
                    buf[:, :, i, :, end - r.kv_len : end] = self.buf[:, :, j, :, self.end - r.kv_len : self.end]
        self.rows, self.buf, self.end = list(keep), buf, end
        for r, segs in add:
            self._write_row(len(self.rows), r, segs)
            self.rows.append(r)

    def _write_row(self, slot: int, r: _Request, segs: Sequence[torch.Tensor]) -> None:
        assert self.buf is not None
        pos = self.end - r.kv_len
        self.buf[:, :, slot, :, :pos] = 0  # pads: finite, masked out
        for seg in segs:
            n = seg.shape[TOKEN_AXIS]
            self.buf[:, :, slot, :, pos : pos + n] = seg
            pos += n
        if pos != self.end:
            raise RuntimeError("embedded engine: KV segments do not cover the row's prefix")

    def join(self, add: Sequence[tuple[_Request, Sequence[torch.Tensor]]]) -> None:
        """Add rows between steps (in place when they fit)."""
        if not add:
            return
        fits = (
            self.buf is not None
            and len(self.rows) + len(add) <= self.buf.shape[2]
            and all(r.kv_len <= self.end for r, _ in add)
            and self.end + max(self._remaining(r) for r, _ in add) + 1 <= self.buf.shape[4]
        )
        if not fits:
            self.rebuild(self.rows, add)
            return
        for r, segs in add:
            self._write_row(len(self.rows), r, segs)
            self.rows.append(r)

    def leave(self, gone: Sequence[_Request]) -> None:
        """Remove rows (the last row moves into each freed slot); compact when padding dominates."""
        gone_ids = {id(r) for r in gone}
        assert self.buf is not None
        i = 0
        while i < len(self.rows):
            if id(self.rows[i]) in gone_ids:
                last = len(self.rows) - 1
                if i != last:
                    self.buf[:, :, i, :, : self.end] = self.buf[:, :, last, :, : self.end]
                    self.rows[i] = self.rows[last]
                self.rows.pop()
            else:
                i += 1
        if not self.rows:
            self.buf, self.end = None, 0
            return
        longest = max(r.kv_len for r in self.rows)
        if self.end - longest > max(64, self.end // 2):
            self.rebuild(self.rows, [])

    def ensure_step_room(self) -> None:
        assert self.buf is not None
        if self.end + 1 > self.buf.shape[4]:
            self.rebuild(self.rows, [])

    def row_kv(self, r: _Request) -> torch.Tensor:
        assert self.buf is not None
        i = self.rows.index(r)
        return self.buf[:, :, i, :, self.end - r.kv_len : self.end]


# ============================================================================================ engine
class EmbeddedEngine:
    """In-process CPU engine (see module docstring); satisfies `protocol.Engine`."""

    def __init__(self, model: LoadedModel, config: EngineConfig = EngineConfig()) -> None:
        if not isinstance(model, LoadedModel):
            raise TypeError(f"EmbeddedEngine needs a LoadedModel (see models.load_model), got {type(model).__name__}")
        self.model_info = model
        self.model = model.model
        self.tokenizer = model.tokenizer
        self.config = config
        cfg = self.model.config
        self.worker_threads = config.num_threads if config.num_threads is not None else (
            1 if int(getattr(cfg, "hidden_size", 0) or 0) < 512 else torch.get_num_threads())
        self.vocab_size = int(cfg.vocab_size)
        self.num_layers = int(cfg.num_hidden_layers)
        self.num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.kv_dtype = model.dtype
        bi = config.batch_invariant
        self.batch_invariant = (model.dtype == torch.float64) if bi is None else bool(bi)
        install_engine_kernels(self.model)
        self._template = torch.empty((self.num_layers, 2, self.num_kv_heads, 0, self.head_dim), dtype=self.kv_dtype)
        self.radix = RadixCache(config.max_total_tokens, token_axis=TOKEN_AXIS)
        self._cv = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._commands: deque[tuple[Callable[[], Any], _Request]] = deque()
        self._by_rid: dict[str, _Request] = {}
        self._normal = _Batch(self._template, config.max_batch_size)
        self._background = _Batch(self._template, config.max_batch_size)
        self._pins: dict[int, RadixNode] = {}
        self._pin_ids = itertools.count(1)
        self._closed = False
        self._counters = {"requests": 0, "finished": 0, "aborted": 0, "failed": 0, "decode_steps": 0,
                          "decode_rows": 0, "prefill_tokens": 0, "prefill_calls": 0, "generated_tokens": 0,
                          "max_batch_rows": 0, "peak_kv_pool_tokens": 0, "rebuilds": 0}
        self._worker = threading.Thread(target=self._loop, name="forerun-engine", daemon=True)
        self._worker_error: BaseException | None = None
        self._worker.start()

    @classmethod
    def from_spec(cls, spec: str = "default", *, dtype: str | torch.dtype | None = None, **config: Any) -> "EmbeddedEngine":
        """`EmbeddedEngine(load_model(spec, dtype=dtype), EngineConfig(**config))`."""
        return cls(load_model(spec, dtype=dtype), EngineConfig(**config))

    # ------------------------------------------------------------------------------------- public API
    def generate(self, input_ids: Sequence[int], params: SamplingParams, *, rid: str | None = None,
                 priority: int = 0) -> GenerateOutput:
        """Run one request to completion (blocking, thread-safe)."""
        req = self._make_request(input_ids, params, rid=rid, priority=priority, mode="generate")
        self._submit([req])
        return self._wait(req)

    def generate_batch(self, requests: Sequence[tuple[Sequence[int], SamplingParams]]) -> list[GenerateOutput]:
        """Run several requests in one batched call; outputs in order (a bad request raises before any runs)."""
        reqs = [self._make_request(ids, p, rid=None, priority=0, mode="generate") for ids, p in requests]
        self._submit(reqs)
        return [self._wait(r) for r in reqs]

    def abort(self, rid: str) -> None:
        """Finish request `rid` (queued or running) with finish_reason {"type": "abort"}; unknown rid: no-op."""
        with self._cv:
            req = self._by_rid.get(rid)
            if req is not None:
                req.aborted = True
                self._cv.notify_all()

    def next_token_logits(self, ids: Sequence[int], *, priority: int = 0) -> np.ndarray:
        """Raw logits at the last position of `ids` (float64 copy); computes and caches the KV of all `ids`.

        priority < 0 queues it as background work (started only when no normal request is queued)."""
        req = self._make_request(ids, SamplingParams(max_new_tokens=0), rid=None, priority=priority, mode="logits")
        self._submit([req])
        return self._wait(req)

    def pin(self, ids: Sequence[int], *, priority: int = 0) -> int:
        """Keep the KV of `ids` resident (computing it if needed) until `unpin(handle)`; returns the handle."""
        req = self._make_request(ids, SamplingParams(max_new_tokens=0), rid=None, priority=priority, mode="pin")
        self._submit([req])
        return self._wait(req)

    def unpin(self, handle: int) -> None:
        def run() -> None:
            node = self._pins.pop(int(handle), None)
            if node is None:
                raise EngineError(f"unpin: unknown pin handle {handle}")
            self.radix.unlock(node)

        self._command(run)

    def flush_cache(self) -> None:
        """Drop every cached prefix that no running request or pin uses."""
        def run() -> None:
            self.radix.evict(self.radix.total_tokens)

        self._command(run)

    def stats(self) -> dict[str, Any]:
        """Counters, radix-cache statistics (hit rate, pool use) and current / peak KV-pool use (tokens)."""
        return self._command(self._stats_now)

    def _stats_now(self) -> dict[str, Any]:
        with self._cv:
            out = dict(self._counters)
            out["rebuilds"] = self._normal.rebuilds + self._background.rebuilds
            out.update({f"radix_{k}": v for k, v in self.radix.stats().items()})
            out["cache_hit_rate"] = self.radix.hit_rate
            out["active_rows"] = len(self._normal) + len(self._background)
            out["active_kv_tokens"] = self._active_kv_tokens()
            out["kv_pool_tokens"] = self.radix.total_tokens + out["active_kv_tokens"]
            out["queued"] = len(self._waiting)
            out["pins"] = len(self._pins)
            steps = out["decode_steps"]
            out["mean_batch_rows"] = out["decode_rows"] / steps if steps else 0.0
        return out

    def server_info(self) -> dict[str, Any]:
        m = self.model_info
        return {
            "engine": "forerun-embedded",
            "model_path": m.path or m.name,
            "served_model_name": m.name,
            "dtype": str(m.dtype).replace("torch.", ""),
            "max_context": m.max_context,
            "vocab_size": self.vocab_size,
            "eos_token_ids": list(m.eos_token_ids),
            "max_total_num_tokens": self.config.max_total_tokens,
            "max_batch_size": self.config.max_batch_size,
            "batch_window_ms": self.config.batch_window_ms,
            "torch_threads": self.worker_threads,
            "internal_states": [self.stats()],
        }

    def close(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        self._worker.join(timeout=30)

    def __enter__(self) -> "EmbeddedEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------- submission
    def _make_request(self, input_ids: Sequence[int], params: SamplingParams, *, rid: str | None,
                      priority: int, mode: str) -> _Request:
        rid = rid if rid is not None else uuid.uuid4().hex
        if not isinstance(params, SamplingParams):
            raise EngineError(f"request {rid}: params must be a forerun SamplingParams, got {type(params).__name__}")
        try:
            ids = tuple(int(i) for i in input_ids)
        except (TypeError, ValueError) as exc:
            raise EngineError(f"request {rid}: input_ids must be integers ({exc})") from exc
        if not ids:
            raise EngineError(f"request {rid}: empty prompt (input_ids is empty)")
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise EngineError(f"request {rid}: token id {bad[0]} outside the vocabulary [0, {self.vocab_size})")
        if params.temperature < 0 or not math.isfinite(params.temperature):
            raise EngineError(f"request {rid}: temperature must be a finite number >= 0, got {params.temperature}")
        total = len(ids) + params.max_new_tokens
        if total > self.model_info.max_context:
            raise EngineError(
                f"request {rid}: prompt ({len(ids)} tokens) + max_new_tokens ({params.max_new_tokens}) = {total} "
                f"exceeds the model context {self.model_info.max_context}"
            )
        if params.return_logprob and params.logprob_start_len >= len(ids):
            raise EngineError(
                f"request {rid}: logprob_start_len {params.logprob_start_len} must be < the prompt length {len(ids)}"
            )
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        return _Request(rid=rid, input_ids=ids, params=params, priority=int(priority), seed=int(seed), mode=mode)

    def _submit(self, reqs: Sequence[_Request]) -> None:
        with self._cv:
            if self._closed:
                raise EngineError("engine is closed")
            if self._worker_error is not None:
                raise EngineError(f"engine worker died: {self._worker_error!r}")
            for r in reqs:
                if r.rid in self._by_rid:
                    raise EngineError(f"request id {r.rid!r} is already running")
            for r in reqs:
                self._by_rid[r.rid] = r
                self._waiting.append(r)
                self._counters["requests"] += 1
            self._cv.notify_all()

    def _wait(self, req: _Request) -> Any:
        deadline = None if self.config.request_timeout_s is None else time.monotonic() + self.config.request_timeout_s
        while not req.done.wait(timeout=0.5):
            if not self._worker.is_alive():
                raise EngineError(f"request {req.rid}: engine worker stopped ({self._worker_error!r})")
            if deadline is not None and time.monotonic() > deadline:
                self.abort(req.rid)
                raise EngineError(f"request {req.rid}: no result within {self.config.request_timeout_s} s")
        if req.error is not None:
            if isinstance(req.error, EngineError):
                raise EngineError(str(req.error)) from req.error
            raise EngineError(f"request {req.rid}: {type(req.error).__name__}: {req.error}") from req.error
        return req.result

    def _command(self, fn: Callable[[], Any]) -> Any:
        req = _Request(rid=uuid.uuid4().hex, input_ids=(), params=SamplingParams(), priority=0, seed=0, mode="command")
        with self._cv:
            if self._closed:
                raise EngineError("engine is closed")
            self._commands.append((fn, req))
            self._cv.notify_all()
        return self._wait(req)

    # ------------------------------------------------------------------------------------- worker loop
    def _loop(self) -> None:
        try:
            torch.set_num_threads(self.worker_threads)  # this thread only
            with torch.inference_mode():
                while True:
                    with self._cv:
                        while (not self._closed and not self._waiting and not self._commands
                               and not self._normal.rows and not self._background.rows):
                            self._cv.wait()
                        if self._closed:
                            break
                        commands = list(self._commands)
                        self._commands.clear()
                        idle = not self._normal.rows and not self._background.rows
                        oldest = self._waiting[0].submitted if self._waiting else None
                    for fn, creq in commands:
                        try:
                            creq.result = fn()
                        except BaseException as exc:  # reported to the caller
                            creq.error = exc
                        creq.done.set()
                    if idle and oldest is not None:
                        # gathering window: let the other fork branches arrive
                        delay = oldest + self.config.batch_window_ms / 1000.0 - time.perf_counter()
                        if delay > 0:
                            time.sleep(delay)
                    self._handle_aborts()
                    self._admit()
                    if self._normal.rows:
                        self._step(self._normal)
                    elif self._background.rows:
                        self._step(self._background)
        except BaseException as exc:  # pragma: no cover - a bug; fail everything loudly
            self._worker_error = exc
            raise
        finally:
            with self._cv:
                pending = list(self._waiting) + self._normal.rows + self._background.rows
                self._waiting.clear()
                commands = list(self._commands)
                self._commands.clear()
            for r in pending:
                self._fail(r, EngineError(f"request {r.rid}: engine closed before it finished"))
            for _, creq in commands:
                creq.error = EngineError("engine closed")
                creq.done.set()

    def _active_kv_tokens(self) -> int:
        return sum(r.kv_len for r in self._normal.rows) + sum(r.kv_len for r in self._background.rows)

    def _note_pool(self) -> None:
        use = self.radix.total_tokens + self._active_kv_tokens()
        if use > self._counters["peak_kv_pool_tokens"]:
            self._counters["peak_kv_pool_tokens"] = use

    # ------------------------------------------------------------------------------------- finishing
    def _release(self, req: _Request) -> None:
        if req.node is not None:
            self.radix.unlock(req.node)
            req.node = None
        with self._cv:
            if self._by_rid.get(req.rid) is req:
                del self._by_rid[req.rid]

    def _fail(self, req: _Request, exc: BaseException) -> None:
        self._release(req)
        req.error = exc
        self._counters["failed"] += 1
        req.done.set()

    def _finish(self, req: _Request, reason: dict[str, Any]) -> None:
        req.finish_reason = reason
        self._release(req)
        req.result = self._build_output(req)
        self._counters["finished"] += 1
        if reason.get("type") == "abort":
            self._counters["aborted"] += 1
        req.done.set()

    def _handle_aborts(self) -> None:
        with self._cv:
            aborted_waiting = [r for r in self._waiting if r.aborted]
            for r in aborted_waiting:
                self._waiting.remove(r)
        for r in aborted_waiting:
            self._finish(r, {"type": "abort", "message": "aborted before it started"})
        for batch in (self._normal, self._background):
            gone = [r for r in batch.rows if r.aborted]
            if gone:
                self._remove_rows(batch, gone)
                for r in gone:
                    self._finish(r, {"type": "abort", "message": "aborted"})

    def _remove_rows(self, batch: _Batch, gone: Sequence[_Request]) -> None:
        batch.leave(gone)

    # ------------------------------------------------------------------------------------- admission
    def _admit(self) -> None:
        with self._cv:
            normal_waiting = [r for r in self._waiting if r.priority >= 0]
            free = self.config.max_batch_size - len(self._normal)
            take = normal_waiting[: max(free, 0)]
            # non-generating requests (logits, pin, scoring) never occupy a batch row
            take += [r for r in normal_waiting[len(take):] if r.mode != "generate" or r.params.max_new_tokens == 0]
            if not normal_waiting and not self._normal.rows:
                bg = [r for r in self._waiting if r.priority < 0]
                free_bg = self.config.max_batch_size - len(self._background)
                take += bg[: max(free_bg, 0)]
            for r in take:
                self._waiting.remove(r)
        joins: dict[int, list[tuple[_Request, list[torch.Tensor]]]] = {0: [], 1: []}
        for r in take:
            try:
                joined = self._prefill(r)
            except EngineError as exc:
                self._fail(r, exc)
                continue
            except Exception as exc:  # a bug or a model error: this request only
                self._fail(r, EngineError(f"request {r.rid}: prefill failed: {type(exc).__name__}: {exc}"))
                continue
            if joined is not None:
                joins[1 if r.priority < 0 else 0].append((r, joined))
        for key, batch in ((0, self._normal), (1, self._background)):
            if joins[key]:
                batch.join(joins[key])
        self._note_pool()

    def _forward(self, buf: torch.Tensor, length: int, input_ids: torch.Tensor, position_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None, logits_to_keep: int, row_starts: Sequence[int]) -> torch.Tensor:
        """One forward over buf's cache (`length` tokens held; row b's valid KV starts at row_starts[b])."""
        cache = _buffer_cache(buf, length)
        _EXACT.on = self.batch_invariant
        _EXACT.row_starts = list(row_starts)
        try:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             cache=cache, use_cache=True, logits_to_keep=logits_to_keep)
        finally:
            _EXACT.on = False
        return out.logits

    def _prefill(self, r: _Request) -> list[torch.Tensor] | None:
        """Reuse the cached prefix, compute the rest of the prompt KV; return the row's KV segments
        (when the request goes on to decode) or None (finished here)."""
        ids = r.input_ids
        n = len(ids)
        need = n if r.mode in ("logits", "pin") else n - 1  # KV to hold before the first decode step
        s = r.input_logprob_start
        limit = need if s < 0 else min(need, s)
        if r.mode == "logits":
            limit = min(limit, n - 1)  # the last position's logits need one computed token
        match = self.radix.match_prefix(ids, max_len=limit)
        self.radix.lock(match.node)
        r.node = match.node
        r.cached_tokens = match.length
        m = match.length
        segments = list(match.segments)
        covered = m
        # logits wanted at positions [first_logit, need): prompt logprobs (s..n-2), or the last (logits mode)
        if r.mode == "logits":
            first_logit = need - 1
        elif s >= 0:
            first_logit = s
        else:
            first_logit = need  # none
        if need > m:
            keep = max(need - max(first_logit, m), 1)
            buf = torch.zeros((self.num_layers, 2, 1, self.num_kv_heads, need, self.head_dim), dtype=self.kv_dtype)
            pos = 0
            for seg in segments:
                k = seg.shape[TOKEN_AXIS]
                buf[:, :, 0, :, pos : pos + k] = seg
                pos += k
            assert pos == m
            x = torch.tensor([ids[m:need]], dtype=torch.long)
            positions = torch.arange(m, need, dtype=torch.long).unsqueeze(0)
            logits = self._forward(buf, m, x, positions, None, keep, [0])[0]  # [keep, V]
            self._counters["prefill_tokens"] += need - m
            self._counters["prefill_calls"] += 1
            new_kv = buf[:, :, 0, :, m:need]
            if not bool(torch.isfinite(logits).all()) or not bool(torch.isfinite(new_kv).all()):
                raise EngineError(f"request {r.rid}: the model produced NaN/inf logits or KV during prefill")
            node, covered = self.radix.insert(ids[:need], new_kv, offset=m)
            self.radix.lock(node)
            self.radix.unlock(r.node)
            r.node = node
            segments.append(new_kv)
            logits_from = need - keep  # position of logits[0]
        else:
            logits = None
            logits_from = need
        if s >= 0 and r.mode == "generate":
            self._fill_input_logprobs(r, logits, logits_from, s, n)
        r.kv_len = need
        if r.mode == "logits":
            assert logits is not None
            last = logits[-1]
            if not bool(torch.isfinite(last).all()):
                raise EngineError(f"request {r.rid}: NaN/inf logits")
            self._release(r)
            r.result = last.to(torch.float64).numpy().copy()
            r.done.set()
            return None
        if r.mode == "pin":
            if covered < n:
                raise EngineError(f"pin: could not keep {n} tokens resident within max_total_tokens "
                                  f"{self.config.max_total_tokens} (the rest of the pool is locked)")
            handle = next(self._pin_ids)
            self.radix.lock(r.node)  # the pin's own lock, kept until unpin
            self._pins[handle] = r.node
            self._release(r)
            r.result = handle
            r.done.set()
            return None
        if r.params.max_new_tokens == 0:
            self._finish(r, {"type": "length", "length": 0})
            return None
        r.next_token = ids[-1]
        return segments

    def _fill_input_logprobs(self, r: _Request, logits: torch.Tensor | None, logits_from: int, s: int, n: int) -> None:
        """SGLang-shifted prompt logprobs for positions s..n-1 (entry 0 None; see module docstring)."""
        r.input_logp0 = [None]
        r.input_entropy = [None]
        r.input_top = [None]
        if n - 1 > s:
            assert logits is not None
            # logits at positions s..n-2 predict tokens s+1..n-1
            lg = logits[s - logits_from : n - 1 - logits_from].to(torch.float64)
            if not bool(torch.isfinite(lg).all()):
                raise EngineError(f"request {r.rid}: NaN/inf logits while scoring the prompt")
            logp = torch.log_softmax(lg, dim=-1)
            targets = torch.tensor(r.input_ids[s + 1 : n], dtype=torch.long)
            r.input_logp0 += logp.gather(1, targets[:, None])[:, 0].tolist()
            r.input_entropy += entropy_from_log_probs(logp).tolist()
            k = r.params.top_logprobs_num
            if k > 0:
                vals, idx = torch.topk(logp, min(k, self.vocab_size), dim=-1)
                for v_row, i_row in zip(vals.tolist(), idx.tolist()):
                    r.input_top.append([[v, i, self._tok_text(i)] for v, i in zip(v_row, i_row)])
            else:
                r.input_top += [None] * (n - 1 - s)

    # ------------------------------------------------------------------------------------- decode
    def _step(self, batch: _Batch) -> None:
        batch.ensure_step_room()  # capacity covers max_new_tokens; kept as a guard
        rows = list(batch.rows)
        B = len(rows)
        P = batch.end
        x = torch.tensor([[r.next_token] for r in rows], dtype=torch.long)
        positions = torch.tensor([[r.kv_len] for r in rows], dtype=torch.long)
        mask = torch.zeros((B, P + 1), dtype=torch.long)
        for i, r in enumerate(rows):
            mask[i, P - r.kv_len :] = 1
        logits = self._forward(batch.active, P, x, positions, mask, 1, [P - r.kv_len for r in rows])[:, -1, :]
        batch.end = P + 1
        for r in rows:
            r.kv_len += 1
        self._counters["decode_steps"] += 1
        self._counters["decode_rows"] += B
        self._counters["max_batch_rows"] = max(self._counters["max_batch_rows"], B)
        finished: list[tuple[_Request, dict[str, Any] | None, BaseException | None]] = []
        lg = logits.to(torch.float64)
        finite_mask = torch.isfinite(lg)
        finite = finite_mask.all(dim=-1).tolist()
        if not all(finite):  # keep the other rows' arithmetic finite; the bad rows fail below
            lg = torch.where(finite_mask, lg, torch.zeros((), dtype=lg.dtype))
        logp0 = torch.log_softmax(lg, dim=-1)
        ent = entropy_from_log_probs(logp0).tolist()
        for i, r in enumerate(rows):
            if not finite[i]:
                finished.append((r, None, EngineError(
                    f"request {r.rid}: the model produced NaN/inf logits at position {r.kv_len - 1}")))
                continue
            try:
                reason = self._sample_one(r, lg[i], logp0[i], ent[i])
            except Exception as exc:
                finished.append((r, None, EngineError(f"request {r.rid}: sampling failed: {type(exc).__name__}: {exc}")))
                continue
            if reason is not None:
                finished.append((r, reason, None))
        self._counters["generated_tokens"] += B
        self._note_pool()
        if finished:
            for r, reason, err in finished:
                if err is None:
                    self._cache_finished(batch, r)
            self._remove_rows(batch, [r for r, _, _ in finished])
            for r, reason, err in finished:
                if err is not None:
                    self._fail(r, err)
                else:
                    self._finish(r, reason)

    def _sample_one(self, r: _Request, logits: torch.Tensor, logp0: torch.Tensor, entropy: float) -> dict[str, Any] | None:
        p = r.params
        position = r.kv_len  # absolute position of the token drawn now
        if p.temperature == 0:
            token = int(torch.argmax(logits))
            logq = 0.0
        else:
            if p.temperature == 1.0 and p.top_k < 0 and p.top_p >= 1.0:
                lq = logp0
            else:
                lq = sampling_log_probs(logits, p.temperature, p.top_k, p.top_p)
            token = sample_inverse_cdf(lq, sampling_uniform(r.seed, position))
            logq = float(lq[token])
        r.output_ids.append(token)
        r.logq.append(logq)
        r.logp0.append(float(logp0[token]))
        r.entropy.append(float(entropy))
        if p.logprob_temperatures:
            r.logq_by_temperature.append([
                float(logits[token] / t - torch.logsumexp(logits / t, dim=-1)) for t in p.logprob_temperatures
            ])
        if p.top_logprobs_num > 0:
            vals, idx = torch.topk(logp0, min(p.top_logprobs_num, self.vocab_size))
            r.top.append([[v, i, self._tok_text(i)] for v, i in zip(vals.tolist(), idx.tolist())])
        r.next_token = token
        n_out = len(r.output_ids)
        if n_out >= p.min_new_tokens:
            if not p.ignore_eos and token in self.model_info.eos_token_ids:
                return {"type": "stop", "matched": token}
            if token in p.stop_token_ids:
                return {"type": "stop", "matched": token}
            if p.stop and self._tail_has_stop(r.output_ids, p.stop):
                text = self.tokenizer.decode(r.output_ids, skip_special_tokens=True)
                hits = [(text.find(st), st) for st in p.stop if st and st in text]
                if hits:
                    cut, st = min(hits)
                    r.stop_text_cut = cut
                    return {"type": "stop", "matched": st}
        if n_out >= p.max_new_tokens:
            return {"type": "length", "length": n_out}
        return None

    def _tail_has_stop(self, output_ids: Sequence[int], stops: Sequence[str]) -> bool:
        """Cheap pre-check: can a stop string have appeared with the newest token?

        A stop string that was absent before the newest token must end inside the text of the last few
        tokens, so decoding a window of (longest stop + 8) tokens finds it without re-decoding the whole
        output at every step (the chat template adds a stop string to every frontend `gen`).
        """
        window = max(len(st) for st in stops) + 8
        if len(output_ids) <= window:
            return True
        tail = self.tokenizer.decode(list(output_ids[-window:]), skip_special_tokens=True)
        return any(st and st in tail for st in stops)

    def _cache_finished(self, batch: _Batch, r: _Request) -> None:
        """Insert prompt + output KV (all fed tokens) into the radix tree; move the request's lock there."""
        seq = r.input_ids + tuple(r.output_ids[:-1])
        assert len(seq) == r.kv_len
        kv = batch.row_kv(r)
        if not bool(torch.isfinite(kv[:, :, :, -len(r.output_ids):]).all()):
            return
        node, _ = self.radix.insert(seq, kv, offset=0)
        self.radix.lock(node)
        if r.node is not None:
            self.radix.unlock(r.node)
        r.node = node

    # ------------------------------------------------------------------------------------- output
    def _tok_text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def _build_output(self, r: _Request) -> GenerateOutput:
        p = r.params
        text = self.tokenizer.decode(r.output_ids, skip_special_tokens=True) if r.output_ids else ""
        if r.stop_text_cut is not None:
            text = text[: r.stop_text_cut]
        meta: dict[str, Any] = {
            "id": r.rid,
            "finish_reason": r.finish_reason,
            "prompt_tokens": len(r.input_ids),
            "completion_tokens": len(r.output_ids),
            "cached_tokens": r.cached_tokens,
            "e2e_latency": time.perf_counter() - r.submitted,
            "sampling_seed": r.seed,
            "output_token_logprobs": [[lq, t, self._tok_text(t)] for lq, t in zip(r.logq, r.output_ids)],
            "output_token_logp0": list(r.logp0),
            "output_token_entropy": list(r.entropy),
        }
        if p.top_logprobs_num > 0:
            meta["output_top_logprobs"] = r.top
        if p.logprob_temperatures:
            meta["logprob_temperatures"] = list(p.logprob_temperatures)
            # [temperature index][token index]: log q_τ'(y_t | ·) over the full vocabulary
            meta["output_token_logq_by_temperature"] = [
                [row[j] for row in r.logq_by_temperature] for j in range(len(p.logprob_temperatures))
            ]
        s = r.input_logprob_start
        if s >= 0:
            toks = r.input_ids[s:]
            meta["input_token_logprobs"] = [[lp, t, self._tok_text(t)] for lp, t in zip(r.input_logp0, toks)]
            meta["input_token_entropy"] = list(r.input_entropy)
            if p.top_logprobs_num > 0:
                meta["input_top_logprobs"] = list(r.input_top)
        return GenerateOutput(
            input_ids=r.input_ids,
            output_ids=tuple(r.output_ids),
            text=text,
            meta_info=meta,
            output_logq=tuple(r.logq),
            output_logp0=tuple(r.logp0),
            output_entropy=tuple(r.entropy),
            input_logp0=tuple(r.input_logp0) if s >= 0 else None,
            input_entropy=tuple(r.input_entropy) if s >= 0 else None,
        )
