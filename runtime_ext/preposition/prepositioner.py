"""Pre-position on idle (Algorithm 1) and confidence-gated serve (Algorithm 2) over any engine.

After each session update the `Prepositioner` queues one background job at the lowest priority
(engine requests with `priority=-1`, which any arriving request pre-empts): one forward pass over
state ‖ E — `PrepositionEngine.ready_distribution` (a 1-token temperature-0 request with
`top_logprobs_num=2`), or the raw logit vector when the engine offers `next_token_logits` and
`keep_logits` is set — whose last-position output is the ready distribution.  It is recorded on the session only if the state is still the one the job read.  A request
then either gets one cached token (gate fired) or falls through to the engine, whose radix cache restores
the pre-paid entry so that only the delta Δ is prefilled (Eq. 5).

    paper                                  code
    B  (cell-budget headroom, tokens)      PrepositionConfig.budget_headroom / headroom_fn() (kv_headroom)
    T_pp = T_prefill(L_entry)   (Eq. 6)    one `_forward_ready` call at priority −1
    Algorithm 1                            Prepositioner.preposition (+ the worker)
    Algorithm 2                            Prepositioner.serve
    L_fast / L_fall / L_cold               ServeResult.path ∈ {fast, fast_relaxed} / fall / cold
    Δ                                      ServeResult.delta
    τ, A                                   PrepositionConfig.gate (GateConfig)
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import numpy as np

from ..protocol import GenerateOutput, SamplingParams
from ..shutdown import close_at_exit
from .engines import PrepositionEngine, as_preposition_engine
from .ready_cache import (
    GateConfig,
    PrepositionCounters,
    ReadyDistribution,
    SessionState,
    gate_fires,
    ready_from_logits,
    ready_from_top_logprobs,
)

ServePath = Literal["fast", "fast_relaxed", "fall", "cold"]


@dataclass(frozen=True)
class PrepositionConfig:
    """Pre-positioning knobs (Algorithm 1 and 2)."""

    gate: GateConfig = field(default_factory=GateConfig)
    """τ and A of the gate (Eq. 12); paper τ = 2.0."""
    budget_headroom: int | None = None
    """B: skip the pre-position when L_entry > B tokens (Algorithm 1 line 2); None: no static bound."""
    background_priority: int = -1
    """Engine priority of pre-position requests (lowest; arriving requests pre-empt them)."""
    keep_logits: bool = False
    """Keep the whole ready logit vector (needs `engine.next_token_logits`); else top-2 log-probs only."""
    background: bool = True
    """Run pre-positions on a worker thread; False runs them inline (deterministic tests)."""

    def __post_init__(self) -> None:
        if self.budget_headroom is not None and self.budget_headroom < 0:
            raise ValueError(f"budget_headroom (B) must be >= 0 or None, got {self.budget_headroom}")
        if self.background_priority >= 0:
            raise ValueError(f"background_priority must be < 0 (below normal requests), got {self.background_priority}")
        if not isinstance(self.gate, GateConfig):
            raise ValueError(f"gate must be a GateConfig, got {type(self.gate).__name__}")


@dataclass(frozen=True)
class ServeResult:
    """One served request: which path it took (Algorithm 2), its first token and critical-path latency."""

    path: ServePath
    token_id: int
    text: str
    latency_s: float
    """Wall time from arrival to the first token (the critical path)."""
    logit_gap: float | None
    """γ of the ready distribution it consulted (None if there was none)."""
    delta: int
    """Tokens of the realized entry beyond the pre-paid one (0 on the fast path; L_entry when cold)."""
    state: tuple[int, ...] = field(repr=False)
    """The session's tokens at the moment the request was checked (what a fresh forward pass would read)."""
    entry: tuple[int, ...] = field(repr=False)
    """The entry the served token conditions on (the realized entry, or the header for `fast_relaxed`)."""
    cached_tokens: int | None = None
    """Engine-reported prefix-cache hit of the fall-through request (SGLang `meta_info.cached_tokens`)."""
    output: GenerateOutput | None = field(default=None, repr=False)


def kv_headroom(engine: Any) -> Callable[[], int]:
    """B from an engine's `stats()`: KV-pool tokens not held by live state (pinned/locked prefixes and
    running requests), i.e. what a pre-position may use without evicting live state (Algorithm 1 line 2).

    Reads the embedded engine's keys `radix_max_total_tokens`, `radix_locked_tokens`, `active_kv_tokens`.
    """
    stats = getattr(engine, "stats", None)
    if stats is None:
        raise ValueError("kv_headroom needs an engine with stats()")

    def headroom() -> int:
        st = stats()
        missing = [k for k in ("radix_max_total_tokens", "radix_locked_tokens", "active_kv_tokens") if k not in st]
        if missing:
            raise KeyError(f"engine stats() lacks {missing}")
        return int(st["radix_max_total_tokens"]) - int(st["radix_locked_tokens"]) - int(st["active_kv_tokens"])

    return headroom


class Prepositioner:
    """Runs Algorithm 1 in idle time and Algorithm 2 on arrival, for any number of sessions."""

    def __init__(
        self, engine: Any, config: PrepositionConfig | None = None, *, tokenizer: Any = None,
        headroom_fn: Callable[[], int] | None = None,
    ) -> None:
        self.engine = engine
        """The engine as given (its optional `next_token_logits`, `pin`/`unpin`, `stats` are used as is)."""
        self.runner: PrepositionEngine = as_preposition_engine(engine)
        """Where the requests go: `engine` itself if it is a `PrepositionEngine`, else `EngineAdapter(engine)`."""
        self.config = config or PrepositionConfig()
        self.tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        self.headroom_fn = headroom_fn
        self._sessions: "weakref.WeakSet[SessionState]" = weakref.WeakSet()
        self._sessions_lock = threading.Lock()
        self._latest: dict[int, int] = {}
        self._job_ids = itertools.count(1)
        self._queue: "queue.Queue[tuple[int, SessionState, int, tuple[int, ...], bool] | None]" = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition()
        self._error: BaseException | None = None
        self._worker: threading.Thread | None = None
        self._closed = False
        if self.config.background:
            self._worker = threading.Thread(target=self._work, name="forerun-preposition", daemon=True)
            self._worker.start()
        close_at_exit(self)  # an unclosed prepositioner must not abort the interpreter at exit (runtime_ext.shutdown)

    # -- Algorithm 1 ----------------------------------------------------------------------------------
    def preposition(self, session: SessionState, entry: Sequence[int], *, header_len: int = 0) -> bool:
        """Queue the idle-time pre-position of `entry` at the session's live end (Algorithm 1).

        Returns False when it is skipped because L_entry > B (the next request takes the cold path).
        Call it right after the mutation that opened the idle window.  `header_len` > 0 marks the last
        tokens of `entry` as the streaming assistant header that ad-hoc queries may match (relaxed).
        """
        self._raise_background_error()
        if self._closed:
            raise RuntimeError("prepositioner is closed")
        entry = tuple(int(t) for t in entry)
        if not entry:
            raise ValueError("entry must hold at least one token (the decision point needs a last token)")
        if not 0 <= header_len <= len(entry):
            raise ValueError(f"header_len must be in [0, {len(entry)}], got {header_len}")
        self._track(session)
        headroom = self.config.budget_headroom
        if self.headroom_fn is not None:
            dynamic = int(self.headroom_fn())
            headroom = dynamic if headroom is None else min(headroom, dynamic)
        if headroom is not None and len(entry) > headroom:
            session.record_skip()  # valid stays false: no eviction of live state
            return False
        version, _ = session.snapshot()
        job = next(self._job_ids)
        with self._idle:
            self._latest[id(session)] = job
            self._pending += 1
        if self.config.background:
            self._queue.put((job, session, version, entry, header_len))
        else:
            self._run_job(job, session, version, entry, header_len)
            self._raise_background_error()
        return True

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._run_job(*item)

    def _run_job(self, job: int, session: SessionState, version: int, entry: tuple[int, ...], header_len: int) -> None:
        try:
            with self._idle:
                superseded = self._latest.get(id(session)) != job
            if superseded or session.closed or session.version != version:
                return  # a newer update arrived before this job started: nothing was computed
            with session.lock:
                if session.closed or session.version != version:
                    return
                state = session.tokens
                session.begin_preposition()
            try:
                ready = self._forward_ready(version, state, entry, header_len)
            except BaseException:
                session.abort_preposition()
                raise
            session.install(ready)
        except BaseException as exc:  # surfaced on the next call: never silently continue
            self._error = exc
        finally:
            with self._idle:
                if self._latest.get(id(session)) == job:
                    del self._latest[id(session)]
                self._pending -= 1
                self._idle.notify_all()

    def _forward_ready(
        self, version: int, state: tuple[int, ...], entry: tuple[int, ...], header_len: int
    ) -> ReadyDistribution:
        """One forward pass over state ‖ E at the lowest priority (Algorithm 1 lines 5-11)."""
        ids = state + entry
        logits_fn = getattr(self.engine, "next_token_logits", None)
        if self.config.keep_logits:
            # the engine's logits call runs at normal priority: keep_logits trades the background priority
            # for the full vector (the vocabulary scan of Eq. 3 at serve time)
            if logits_fn is None:
                raise ValueError("keep_logits needs an engine with next_token_logits(ids)")
            logits = np.asarray(logits_fn(list(ids)))
            return ready_from_logits(version, state, entry, logits, keep_logits=True, header_len=header_len)
        top = self.runner.ready_distribution(ids, priority=self.config.background_priority)
        return ready_from_top_logprobs(version, state, entry, top, header_len=header_len)

    # -- Algorithm 2 ----------------------------------------------------------------------------------
    def serve(
        self, session: SessionState, realized_entry: Sequence[int], *, allow_relaxed: bool = False,
        max_new_tokens: int = 1, rid: str | None = None,
    ) -> ServeResult:
        """Serve a request whose entry (query prefix + header, or envelope + payload) is `realized_entry`.

        Fast path iff a valid ready distribution matches the realized entry exactly (or, with
        `allow_relaxed`, ends with the pre-positioned generic header) and the gate of Eq. 12 fires:
        one cached token, no engine call.  Otherwise the engine generates from state ‖ realized entry at
        normal priority; its radix cache restores the pre-paid prefix.
        """
        t0 = time.perf_counter()
        realized = tuple(int(t) for t in realized_entry)
        if not realized:
            raise ValueError("realized_entry must hold at least one token")
        self._track(session)
        look = session.lookup(realized, allow_relaxed=allow_relaxed)
        gap: float | None = None
        if look.ready is not None and look.match in ("exact", "relaxed"):
            token, gap = look.ready.scan()
            if gate_fires(gap, token, self.config.gate):
                path: ServePath = "fast" if look.match == "exact" else "fast_relaxed"
                session.count("served_fast" if path == "fast" else "served_fast_relaxed")
                text = self._decode(token)
                return ServeResult(
                    path=path, token_id=token, text=text, latency_s=time.perf_counter() - t0, logit_gap=gap,
                    delta=0, state=look.state, entry=look.ready.entry_ids,
                )
        if look.ready is not None:
            gap = look.ready.logit_gap if gap is None else gap
            session.count("fell_through")
            path = "fall"
            if look.match == "exact":
                delta = 0
            elif look.match == "prefix":
                delta = len(realized) - look.ready.entry_len
            else:
                delta = len(realized)
        else:
            session.count("cold")
            path = "cold"
            delta = len(realized)
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=max_new_tokens == 1)
        out = self.runner.generate(look.state + realized, params, priority=0)
        if not out.output_ids:
            raise RuntimeError("engine returned no output token for a served request")
        latency = time.perf_counter() - t0
        cached = out.meta_info.get("cached_tokens")
        return ServeResult(
            path=path, token_id=int(out.output_ids[0]), text=out.text, latency_s=latency, logit_gap=gap,
            delta=delta, state=look.state, entry=realized, cached_tokens=None if cached is None else int(cached),
            output=out,
        )

    # -- bookkeeping ----------------------------------------------------------------------------------
    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every queued pre-position has finished; re-raises a background failure."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        self._raise_background_error()
        return True

    @property
    def counters(self) -> PrepositionCounters:
        """Counters summed over the live sessions this prepositioner has served (weakly referenced)."""
        total = PrepositionCounters()
        with self._sessions_lock:
            sessions = list(self._sessions)
        for s in sessions:
            with s.lock:
                total = total.add(s.counters)
        return total

    def close(self) -> None:
        """Stop the worker (queued jobs are dropped)."""
        if self._closed:
            return
        self._closed = True
        with self._idle:
            self._latest.clear()
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=30)

    def __enter__(self) -> "Prepositioner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _track(self, session: SessionState) -> None:
        with self._sessions_lock:
            self._sessions.add(session)

    def _decode(self, token: int) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode([token])

    def _raise_background_error(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"a background pre-position failed: {err!r}") from err
