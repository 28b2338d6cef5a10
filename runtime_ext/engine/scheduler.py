"""The embedded CPU engine: transformers forward + radix KV cache + continuous batching.

Requests arrive from many threads (the fork branches of an sgl program) and are gathered into one batch
(`EngineConfig.batch_window_ms`).  Each request reuses its longest cached prefix, prefills the rest
(`prefill`), and then joins the running decode batch (`batch`): one batched forward per step over
left-padded KV (zeros in the attention mask over the pads, explicit true positions), new arrivals join
between steps.  This module holds the public API, the worker loop and admission; a step's sampling is in
`decode` (its math in `sampling`, constrained rows' masks in `grammar`: compiled at submission, on the caller's
thread), the model adapters in `forward`, the result shape in `output`.

Per generated token y_t at absolute position p the engine returns

    paper / notion                        code
    log p0(y_t | y_<t)  (raw logits)      output_logp0     meta_info["output_token_logp0"]
    log q_τ(y_t | y_<t) (sampled from)    output_logq      meta_info["output_token_logprobs"][t][0]
    H(p0(· | y_<t)), natural log          output_entropy   meta_info["output_token_entropy"]
    top-k of p0                           meta_info["output_top_logprobs"]
    sampling noise u(seed, p)             sampling_uniform(seed, p)

Priorities: requests with priority < 0 (background pre-positioning) run in a separate batch that only
steps when no normal request is queued or running.  A pin taken at priority < 0 yields too: when a
normal-priority request (a decoding row, a pin, a logits request) needs KV room that only such pins hold,
the engine drops them, oldest first (`unpin` of a dropped handle is then a no-op), so background work never
makes a user request fail.  `abort(rid)` finishes a request (queued, prefilling or running) with
finish_reason {"type": "abort"} before its next token; `generate` returns that output (it does not raise)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..protocol import EngineError, GenerateOutput, SamplingParams
from ..shutdown import close_at_exit
from .admission import check_fits_budget, take_admissible
from .admission import release as release_reservation
from .batch import RunningBatch, batch_pair, private_kv
from .config import EngineConfig
from .forward import TOKEN_AXIS, all_finite, forward_on_buffer, plan_forward
from .models import LoadedModel, load_model
from .decode import Finished, sample_step
from .grammar import EngineGrammars
from .kv_handoff import cache_finished_row
from .output import build_output
from .prefill import PromptKV, compute_prompt_kv, fill_input_logprobs, prefill_span
from .radix_cache import RadixCache, RadixNode
from .requests import Request, RequestMode, command_request, make_request
from .pins import PinsMixin
from .row_streams import StreamingMixin, notify_rows


class EmbeddedEngine(PinsMixin, StreamingMixin):
    """In-process CPU engine (see module docstring); satisfies `protocol.Engine` and `protocol.StreamingEngine`."""

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
        self.plan = plan_forward(self.model, config.batch_invariant)
        self.kv_dtype = self.plan.kv_dtype
        self.batch_invariant = self.plan.batch_invariant
        self._template = torch.empty((self.num_layers, 2, self.num_kv_heads, 0, self.head_dim), dtype=self.kv_dtype)
        self.radix = RadixCache(config.max_total_tokens, token_axis=TOKEN_AXIS)
        self._cv = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._commands: deque[tuple[Callable[[], Any], Request]] = deque()
        self._by_rid: dict[str, Request] = {}
        share = self.plan.lean is not None  # the native forward reads cached prefixes in place
        self._normal, self._background = batch_pair(self._template, config.max_batch_size, share_prefix=share)
        self._pins: dict[int, RadixNode] = {}
        self._yielding: dict[int, RadixNode] = {}
        """Pins taken at priority < 0, oldest first: dropped when a normal request needs their room."""
        self._yielded: set[int] = set()
        """Handles of yielding pins the engine dropped (their `unpin` is a no-op)."""
        self._pin_ids = itertools.count(1)
        self.grammars = EngineGrammars(self.tokenizer, self.vocab_size, model.eos_token_ids)
        self._closed = False
        self._counters = {"requests": 0, "finished": 0, "aborted": 0, "failed": 0, "decode_steps": 0,
                          "decode_rows": 0, "prefill_tokens": 0, "prefill_calls": 0, "generated_tokens": 0,
                          "max_batch_rows": 0, "peak_kv_pool_tokens": 0, "rebuilds": 0, "decode_s": 0.0,
                          "stream_shared_tokens": 0, "pins_yielded": 0, "constrained_rows": 0}
        self._after_prefill = {RequestMode.GENERATE: self._start_decode, RequestMode.LOGITS: self._return_logits,
                               RequestMode.PIN: self._hold_pin}
        self._worker = threading.Thread(target=self._loop, name="forerun-engine", daemon=True)
        self._worker_error: BaseException | None = None
        self._worker.start()
        close_at_exit(self)  # an unclosed engine must not abort the interpreter at exit (runtime_ext.shutdown)

    @classmethod
    def from_spec(cls, spec: str = "default", *, dtype: str | torch.dtype | None = None, **config: Any) -> "EmbeddedEngine":
        """`EmbeddedEngine(load_model(spec, dtype=dtype), EngineConfig(**config))`."""
        return cls(load_model(spec, dtype=dtype), EngineConfig(**config))

    # ------------------------------------------------------------------------------------- public API
    def generate(self, input_ids: Sequence[int], params: SamplingParams, *, rid: str | None = None,
                 priority: int = 0) -> GenerateOutput:
        """Run one request to completion (blocking, thread-safe)."""
        req = self._make_request(input_ids, params, rid=rid, priority=priority, mode=RequestMode.GENERATE)
        self._submit([req])
        return self._wait(req)

    def generate_batch(self, requests: Sequence[tuple[Sequence[int], SamplingParams]]) -> list[GenerateOutput]:
        """Run several requests in one batched call; outputs in order (a bad request raises before any runs)."""
        reqs = [self._make_request(ids, p, rid=None, priority=0, mode=RequestMode.GENERATE) for ids, p in requests]
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
        req = self._make_request(ids, SamplingParams(max_new_tokens=0), rid=None, priority=priority,
                                 mode=RequestMode.LOGITS)
        self._submit([req])
        return self._wait(req)

    def flush_cache(self) -> None:
        """Drop every cached prefix that no running request or pin uses, and the kept memory of a batch buffer."""
        def run() -> None:
            self.radix.evict(self.radix.total_tokens)
            self._normal.spare.drop()  # shared with the background batch

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
            out.update(self.grammars.stats())
            out["active_rows"] = len(self._normal) + len(self._background)
            out["active_kv_tokens"] = sum(r.kv_len for b in (self._normal, self._background) for r in b.rows)
            out["kv_pool_tokens"] = self._note_pool()
            out["queued"] = len(self._waiting)
            out["pins"] = len(self._pins)
            out["yielding_pins"] = len(self._yielding)
            # what new KV may still take without evicting anything held: each token counted once (a locked
            # prefix that running rows read in place is in radix_locked_tokens only)
            out["kv_headroom_tokens"] = (self.radix.max_total_tokens - out["radix_locked_tokens"]
                                         - self.radix.reserved)
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
            "kv_dtype": str(self.kv_dtype).replace("torch.", ""),
            "kernels": self.plan.path,
            "batch_invariant": self.batch_invariant,
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
                      priority: int, mode: RequestMode) -> Request:
        r = make_request(input_ids, params, rid=rid, priority=priority, mode=mode,
                         vocab_size=self.vocab_size, max_context=self.model_info.max_context)
        check_fits_budget(r, self.config.max_total_tokens)
        r.grammar = self.grammars.for_request(r.rid, params, r.decodes)
        return r

    def _submit(self, reqs: Sequence[Request]) -> None:
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

    def _wait(self, req: Request) -> Any:
        deadline = None if self.config.request_timeout_s is None else time.monotonic() + self.config.request_timeout_s
        poll = 0.5 if deadline is None else min(0.5, self.config.request_timeout_s)
        while not req.done.wait(timeout=poll):
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
        req = command_request()
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
                while self._loop_once():
                    pass
        except BaseException as exc:  # pragma: no cover - a bug; fail everything loudly
            self._worker_error = exc
            raise
        finally:
            self._fail_pending()

    def _loop_once(self) -> bool:
        """One pass of the worker: wait for work, run commands, gather, admit, step; False once closed."""
        with self._cv:
            while (not self._closed and not self._waiting and not self._commands
                   and not self._normal.rows and not self._background.rows):
                self._cv.wait()
            if self._closed:
                return False
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
        return True

    def _fail_pending(self) -> None:
        """The worker is gone: every queued or running request and command fails."""
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

    def _note_pool(self) -> int:
        """KV the engine holds, each token once (the tree's, each row's `private_kv`), noted in the peak."""
        use = self.radix.total_tokens + sum(private_kv(r, b.share_prefix) for b in (self._normal, self._background)
                                            for r in b.rows)
        self._counters["peak_kv_pool_tokens"] = max(self._counters["peak_kv_pool_tokens"], use)
        return use

    # ------------------------------------------------------------------------------------- finishing
    def _release(self, req: Request) -> None:
        release_reservation(self.radix, req)
        req.prefix = []  # KV segments held by reference
        if req.node is not None:
            self.radix.unlock(req.node)
            req.node = None
        with self._cv:
            if self._by_rid.get(req.rid) is req:
                del self._by_rid[req.rid]

    def _fail(self, req: Request, exc: BaseException) -> None:
        self._release(req)
        req.error = exc
        self._counters["failed"] += 1
        req.done.set()
        notify_rows([req])

    def _finish(self, req: Request, reason: dict[str, Any]) -> None:
        req.finish_reason = reason
        self._release(req)
        req.result = build_output(req, self.tokenizer)
        self._counters["finished"] += 1
        req.done.set()
        if reason.get("type") == "abort":
            self._counters["aborted"] += 1
            notify_rows([req])

    def _handle_aborts(self) -> None:
        with self._cv:
            aborted_waiting = [r for r in self._waiting if r.aborted]
            for r in aborted_waiting:
                self._waiting.remove(r)
        for r in aborted_waiting:
            self._finish(r, {"type": "abort", "message": "aborted before it started"})
        for batch in (self._normal, self._background):
            gone = [r for r in batch.rows if r.aborted]
            if gone:  # its KV into the tree, as a finished row's: a request that resumes it is a hit
                self._leave(batch, [(r, bool(r.output_ids) and len(r.input_ids) + len(r.output_ids) - 1 == r.kv_len)
                                    for r in gone])
                for r in gone:
                    self._finish(r, {"type": "abort", "message": "aborted"})

    # ------------------------------------------------------------------------------------- admission
    def _admit(self) -> None:
        take = self._take_admissible()
        joins: dict[int, list[tuple[Request, list[torch.Tensor]]]] = {0: [], 1: []}
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
            batch.track_tree()  # a prefill may have split a node running rows read: their old tensor goes now
            batch.join(joins[key])
        self._note_pool()
        if take:  # an abort that arrived during a prefill ends its request before it decodes a token
            self._handle_aborts()

    def _take_admissible(self) -> list[Request]:
        """Dequeue what starts now (see `admission.take_admissible`); fail what can never start."""
        with self._cv:
            self._share_from_parents()  # a streamed child is charged only what it adds to its running parent
            take, failed = take_admissible(
                self._waiting, self.radix, free_rows=self.config.max_batch_size - len(self._normal),
                free_background_rows=self.config.max_batch_size - len(self._background),
                normal_running=bool(self._normal.rows), make_room=self._yield_pins,
                shares_prefix=self._normal.share_prefix)
            for r in take + [r for r, _ in failed]:
                self._waiting.remove(r)
        for r, exc in failed:
            self._fail(r, exc)
        return take

    def _forward(self, buf: torch.Tensor, length: int, input_ids: torch.Tensor, position_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None, logits_to_keep: int, row_starts: Sequence[int],
                 segments: Sequence[Sequence[torch.Tensor]] | None = None) -> torch.Tensor:
        """One forward over buf's cache (`length` tokens held; row b's valid KV starts at row_starts[b], after
        its prefix `segments[b]` read in place - native forward only)."""
        if self.plan.lean is not None:
            return self.plan.lean.forward(buf, length, input_ids, position_ids, logits_to_keep, row_starts, segments)
        assert segments is None
        return forward_on_buffer(self.model, buf, length, input_ids, position_ids, attention_mask, logits_to_keep,
                                 row_starts, batch_invariant=self.batch_invariant)

    # ------------------------------------------------------------------------------------- prefill
    def _prefill(self, r: Request) -> list[torch.Tensor] | None:
        """Reuse the cached prefix, compute the rest of the prompt KV, then complete r by its mode: the
        row's KV segments when r goes on to decode, None when it finished here."""
        span = prefill_span(r)
        if self._yielding and r.priority >= 0 and not r.decodes:  # a user pin / logits request: its KV first
            node = self.radix.deepest_cached(r.input_ids[: span.need])
            depth, p = 0, node
            while p is not None:
                depth, p = depth + len(p.key), p.parent
            self._yield_pins(span.need - depth, node)
        kv = compute_prompt_kv(r, span, self.radix, self._forward, self._template, self._counters,
                               share_prefix=self._normal.share_prefix)
        r.kv_len = span.need
        return self._after_prefill[r.mode](r, kv)

    def _start_decode(self, r: Request, kv: PromptKV) -> list[torch.Tensor] | None:
        """GENERATE: prompt logprobs when asked; a scoring request (max_new_tokens = 0) finishes here."""
        if r.input_logprob_start >= 0:
            fill_input_logprobs(r, kv, self.vocab_size, self.tokenizer, self.plan.kernels)
        if r.params.max_new_tokens == 0:
            self._finish(r, {"type": "length", "length": 0})
            return None
        r.next_token = r.input_ids[-1]
        return kv.segments

    def _return_logits(self, r: Request, kv: PromptKV) -> None:
        """LOGITS: the raw logits at the last prompt position (float64 copy)."""
        assert kv.logits is not None
        last = kv.logits[-1]
        if not all_finite(last):
            raise EngineError(f"request {r.rid}: NaN/inf logits")
        self._release(r)
        r.result = last.to(torch.float64).numpy().copy()
        r.done.set()

    # ------------------------------------------------------------------------------------- decode
    def _step(self, batch: RunningBatch) -> None:
        """One batched decode step: a token for every row; finished rows leave the batch."""
        start = time.perf_counter()
        batch.ensure_step_room()  # capacity covers max_new_tokens; kept as a guard
        rows = list(batch.rows)
        x, positions, mask, row_starts = batch.step_inputs()
        logits = self._forward(batch.active, batch.end, x, positions, mask, 1, row_starts, batch.prefixes())[:, -1, :]
        batch.advance()
        B = len(rows)
        self._counters["decode_steps"] += 1
        self._counters["decode_rows"] += B
        self._counters["constrained_rows"] += sum(r.grammar is not None for r in rows)
        self._counters["max_batch_rows"] = max(self._counters["max_batch_rows"], B)
        finished = sample_step(rows, logits, vocab_size=self.vocab_size, eos_token_ids=self.model_info.eos_token_ids,
                               tokenizer=self.tokenizer, kernels=self.plan.kernels)
        self._counters["generated_tokens"] += B
        self._counters["decode_s"] += time.perf_counter() - start  # forward + sampling (per-step cost model)
        self._note_pool()
        if finished:
            self._retire(batch, finished)
        notify_rows(rows)

    def _retire(self, batch: RunningBatch, finished: Sequence[Finished]) -> None:
        """Cache the finished rows' KV, take them out of the batch, then finish or fail each."""
        self._leave(batch, [(r, err is None) for r, _, err in finished])
        for r, reason, err in finished:
            if err is not None:
                self._fail(r, err)
            else:
                self._finish(r, reason)

    def _leave(self, batch: RunningBatch, rows: Sequence[tuple[Request, bool]]) -> None:
        """Rows leave the batch: reservations released, KV into the tree where asked (as far as it fits)."""
        for r, cache in rows:
            release_reservation(self.radix, r)
            if cache:
                cache_finished_row(self.radix, batch, r)
        batch.leave([r for r, _ in rows])
