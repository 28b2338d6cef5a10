"""Pre-position on idle (Algorithm 1) and confidence-gated serve (Algorithm 2) over any engine.

After each session update the `Prepositioner` queues one background job at the lowest priority
(engine requests with `priority=-1`, which any arriving request pre-empts).  The job pre-positions each
entry of the decision point in turn: one forward pass over state ‖ E — `PrepositionEngine.ready_distribution`
(a 1-token temperature-0 request with `top_logprobs_num=2`), or the raw logit vector when the engine
offers `next_token_logits` and `keep_logits` is set — whose last-position output is the ready
distribution.  Right before each pass it checks the budget B (Algorithm 1 line 2: when the job runs, not
when it was queued); after it, it pins state ‖ E in the engine (the pre-paid entry, so that the Δ a
fall-through reports is really pre-paid) and records the distribution on the session only if the state
is still the one the job read.  A request then either gets one cached token (gate fired) or falls through
to the engine, whose radix cache restores the pre-paid entry so that only the delta Δ is prefilled (Eq. 5).

A background failure is kept on its own session and raised by that session's next call, never another's.

    paper                                  code
    B  (cell-budget headroom, tokens)      PrepositionConfig.budget_headroom, and by default the engine's
                                           free KV pool (kv_headroom) read when the job runs
    T_pp = T_prefill(L_entry)   (Eq. 6)    one `_forward_ready` call at priority −1
    Algorithm 1                            Prepositioner.preposition (+ the worker, `_run_job`)
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
from .counters import PrepositionCounters
from .engines import PrepositionEngine, as_preposition_engine
from .gate import GateConfig, gate_decision, gate_fires
from .ready_cache import (
    Lookup,
    MatchKind,
    ReadyDistribution,
    Role,
    SessionState,
    ready_from_logits,
    ready_from_top_logprobs,
    token_ids,
)

ServePath = Literal["fast", "fast_relaxed", "fall", "cold"]
Job = tuple[int, SessionState, int, tuple[tuple[tuple[int, ...], Role], ...]]


@dataclass(frozen=True)
class PrepositionConfig:
    """Pre-positioning knobs (Algorithm 1 and 2)."""

    gate: GateConfig = field(default_factory=GateConfig)
    """τ and A of the gate (Eq. 12); paper τ = 2.0."""
    budget_headroom: int | None = None
    """B as a static bound: skip an entry when L_entry > B tokens (Algorithm 1 line 2); None: no static bound."""
    engine_headroom: bool = True
    """Also bound B by the engine's free KV pool (`kv_headroom`) when the engine reports it (`stats()`)."""
    pin_entries: bool = True
    """Pin state ‖ E in the engine (`pin`/`unpin`) while the pre-position is valid: the pre-paid entry
    cannot be evicted before the request that resumes from it."""
    background_priority: int = -1
    """Engine priority of pre-position requests (lowest; arriving requests pre-empt them)."""
    keep_logits: bool = False
    """Keep the whole ready logit vector (needs `engine.next_token_logits`); else top-2 log-probs only."""
    background: bool = True
    """Run pre-positions on a worker thread; False runs them inline (deterministic tests)."""

    def __post_init__(self) -> None:
        b = self.budget_headroom
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 0):
            raise ValueError(f"budget_headroom (B) must be an integer >= 0 or None, got {b!r}")
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
    """γ of the ready distribution the gate tested (exact or relaxed match); None when none was tested."""
    delta: int
    """Tokens of the realized entry beyond the pre-paid one (0 on the fast path; L_entry when cold)."""
    state: tuple[int, ...] = field(repr=False)
    """The session's tokens at the moment the request was checked (what a fresh forward pass would read)."""
    entry: tuple[int, ...] = field(repr=False)
    """The entry the served token conditions on (the realized entry, or the header for `fast_relaxed`)."""
    cached_tokens: int | None = None
    """Engine-reported prefix-cache hit of the fall-through request (SGLang `meta_info.cached_tokens`)."""
    output: GenerateOutput | None = field(default=None, repr=False)
    version: int = -1
    """The state version the request was checked against (a commit built on it passes `expect_version`)."""
    match: MatchKind = "none"
    reason: str = ""
    """Why this path: the gate's decision (γ vs τ, â vs A) or why no distribution applied."""


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


def context_limit(engine: Any) -> int | None:
    """The engine's context window in tokens (the embedded engine's `model_info.max_context`), if known."""
    limit = getattr(getattr(engine, "model_info", None), "max_context", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else None


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
        vocab = getattr(engine, "vocab_size", None)
        self.vocab_size: int | None = vocab if isinstance(vocab, int) and vocab > 0 else None
        """Token ids of entries and requests must lie below it (checked before any work), when known."""
        if self.vocab_size is not None:
            self.config.gate.check_vocab(self.vocab_size)
        self.tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        if headroom_fn is None and self.config.engine_headroom and callable(getattr(engine, "stats", None)):
            headroom_fn = kv_headroom(engine)
        self.headroom_fn = headroom_fn
        self.max_context = context_limit(engine)
        """The engine's context window (sessions validate their commits against it), None if unknown."""
        self._sessions: "weakref.WeakSet[SessionState]" = weakref.WeakSet()
        self._sessions_lock = threading.Lock()
        self._latest: dict[int, int] = {}
        self._job_ids = itertools.count(1)
        self._queue: "queue.Queue[Job | None]" = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition()
        self._worker: threading.Thread | None = None
        self._closed = False
        if self.config.background:
            self._worker = threading.Thread(target=self._work, name="forerun-preposition", daemon=True)
            self._worker.start()
        close_at_exit(self)  # an unclosed prepositioner must not abort the interpreter at exit (runtime_ext.shutdown)

    # -- Algorithm 1 ----------------------------------------------------------------------------------
    def preposition(self, session: SessionState, *entries: Sequence[int], header: Sequence[int] | None = None) -> bool:
        """Queue the idle-time pre-position of the decision point at the session's live end (Algorithm 1).

        Each of `entries` is served on an exact match; `header` (the streaming generic assistant header)
        also answers relaxed matches, ad-hoc queries ending with it (§3.4).  Call it right after the
        mutation that opened the idle window.  Returns True when queued (background) or when at least one
        entry was installed (inline); an entry over the budget B is skipped when the job runs.
        """
        self._raise_for(session)
        if self._closed:
            raise RuntimeError("prepositioner is closed")
        jobs: list[tuple[tuple[int, ...], Role]] = []
        head = None if header is None else self._ids(header, "header")
        for e in entries:
            ids = self._ids(e, "entry")
            if ids != head and all(ids != j for j, _ in jobs):
                jobs.append((ids, "entry"))
        if head is not None:
            jobs.append((head, "header"))
        if not jobs or any(not ids for ids, _ in jobs):
            raise ValueError("every entry must hold at least one token (the decision point needs a last token)")
        self._track(session)
        version, _ = session.snapshot()
        job = next(self._job_ids)
        with self._idle:
            self._latest[id(session)] = job
            self._pending += 1
        if self.config.background:
            self._queue.put((job, session, version, tuple(jobs)))
            return True
        installed = self._run_job(job, session, version, tuple(jobs))
        self._raise_for(session)
        return installed > 0

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._run_job(*item)

    def _run_job(self, job: int, session: SessionState, version: int,
                 jobs: tuple[tuple[tuple[int, ...], Role], ...]) -> int:
        """Pre-position each entry in turn while the state is still the version the job was queued for."""
        installed = 0
        try:
            for entry, role in jobs:
                if not self._still_current(job, session, version):
                    break  # a newer update arrived: nothing more is computed for this one
                if self._over_budget(entry):
                    session.record_skip()  # valid stays false: no eviction of live state
                    continue
                with session.lock:
                    if session.closed or session.version != version:
                        break
                    state = session.tokens
                    session.begin_preposition()
                try:
                    ready = self._forward_ready(version, state, entry, role)
                    pin = self._pin(state + entry)
                except BaseException:
                    session.abort_preposition()
                    raise
                installed += session.install(ready, pin=pin)
                self.release_pins(session)
        except BaseException as exc:  # kept on its own session: raised by that session's next call
            session.record_background_error(exc)
        finally:
            with self._idle:
                if self._latest.get(id(session)) == job:
                    del self._latest[id(session)]
                self._pending -= 1
                self._idle.notify_all()
        return installed

    def _still_current(self, job: int, session: SessionState, version: int) -> bool:
        with self._idle:
            if self._latest.get(id(session)) != job:
                return False
        return not session.closed and session.version == version

    def _over_budget(self, entry: tuple[int, ...]) -> bool:
        """Algorithm 1 line 2, evaluated when the job runs: L_entry > B."""
        budget = self.config.budget_headroom
        if self.headroom_fn is not None:
            dynamic = int(self.headroom_fn())
            budget = dynamic if budget is None else min(budget, dynamic)
        return budget is not None and len(entry) > budget

    def _pin(self, ids: tuple[int, ...]) -> Any:
        pin, unpin = getattr(self.engine, "pin", None), getattr(self.engine, "unpin", None)
        if not self.config.pin_entries or pin is None or unpin is None:
            return None
        return pin(list(ids))

    def release_pins(self, session: SessionState) -> None:
        """Unpin the pre-paid entries that `session` invalidated or refused (outside its lock)."""
        unpin = getattr(self.engine, "unpin", None)
        for handle in session.take_released_pins():
            if unpin is not None:
                unpin(handle)

    def _forward_ready(
        self, version: int, state: tuple[int, ...], entry: tuple[int, ...], role: Role
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
            return ready_from_logits(version, state, entry, logits, keep_logits=True, role=role)
        top = self.runner.ready_distribution(ids, priority=self.config.background_priority)
        return ready_from_top_logprobs(version, state, entry, top, role=role)

    # -- Algorithm 2 ----------------------------------------------------------------------------------
    def serve(
        self, session: SessionState, realized_entry: Sequence[int], *, allow_relaxed: bool = False,
        max_new_tokens: int = 1, rid: str | None = None,
    ) -> ServeResult:
        """Serve a request whose entry (query prefix + header, or envelope + payload) is `realized_entry`.

        Fast path iff a valid ready distribution matches the realized entry exactly (or, with
        `allow_relaxed`, the realized entry ends with the pre-positioned generic header: the header's
        question-independent token) and the gate of Eq. 12 fires: one cached token, no engine call.
        Otherwise the engine generates from state ‖ realized entry at normal priority; its radix cache
        restores the pre-paid prefix.
        """
        t0 = time.perf_counter()
        self._raise_for(session)
        realized = self._ids(realized_entry, "realized_entry")
        if not realized:
            raise ValueError("realized_entry must hold at least one token")
        self._track(session)
        look = session.lookup(realized, allow_relaxed=allow_relaxed)
        gap: float | None = None
        reason = ""
        if look.ready is not None and look.match in ("exact", "relaxed"):
            token, gap = look.ready.scan()
            if gate_fires(gap, token, self.config.gate):
                return self._fast(session, look, token, gap, t0)
            reason = gate_decision(gap, token, self.config.gate, token_text=self._decode(token)).reason
        path, delta, reason = self._fall_path(session, look, realized, reason)
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=max_new_tokens == 1)
        out = self.runner.generate(look.state + realized, params, priority=0)
        if not out.output_ids:
            raise RuntimeError("engine returned no output token for a served request")
        latency = time.perf_counter() - t0
        self.release_pins(session)
        cached = out.meta_info.get("cached_tokens")
        return ServeResult(
            path=path, token_id=int(out.output_ids[0]), text=out.text, latency_s=latency, logit_gap=gap,
            delta=delta, state=look.state, entry=realized, cached_tokens=None if cached is None else int(cached),
            output=out, version=look.version, match=look.match, reason=reason,
        )

    def _fast(self, session: SessionState, look: Lookup, token: int, gap: float, t0: float) -> ServeResult:
        """Algorithm 2 line 7: one cached token, no scheduler, no decode."""
        assert look.ready is not None
        path: ServePath = "fast" if look.match == "exact" else "fast_relaxed"
        if path == "fast_relaxed":
            session.consume(look.ready)  # a relaxed match is a hit only when its token is served
        session.count("served_fast" if path == "fast" else "served_fast_relaxed")
        text = self._decode(token)
        latency = time.perf_counter() - t0
        why = gate_decision(gap, token, self.config.gate, token_text=text).reason
        if path == "fast_relaxed":
            why = "relaxed match (question-independent header token); " + why
        return ServeResult(path=path, token_id=token, text=text, latency_s=latency, logit_gap=gap, delta=0,
                           state=look.state, entry=look.ready.entry_ids, version=look.version, match=look.match,
                           reason=why)

    def _fall_path(self, session: SessionState, look: Lookup, realized: tuple[int, ...],
                   gate_reason: str) -> tuple[ServePath, int, str]:
        """(path, Δ, reason) of a request that does not take the fast path (Eq. 5 / Eq. 2)."""
        if look.match == "exact":
            session.count("fell_through")
            return "fall", 0, gate_reason + "; the pre-paid entry is restored (Δ = 0)"
        if look.match == "relaxed":
            session.count("fell_through")
            why = "relaxed match of the generic header, " + gate_reason
            if look.prepaid is not None:
                session.consume(look.prepaid)
                return "fall", len(realized) - look.prepaid.entry_len, why
            return "fall", len(realized), why + "; nothing of this entry is pre-paid"
        if look.match == "prefix":
            assert look.ready is not None
            session.count("fell_through")
            delta = len(realized) - look.ready.entry_len
            return "fall", delta, f"the entry extends a pre-positioned one: resumes after it (Δ = {delta})"
        if look.held:
            session.count("fell_through")
            return "fall", len(realized), "the entry matches no pre-positioned entry (no relaxed match allowed here)"
        session.count("cold")
        return "cold", len(realized), "no valid pre-position (none yet, invalidated by an update, or skipped)"

    # -- bookkeeping ----------------------------------------------------------------------------------
    def wait_idle(self, timeout: float | None = None, *, session: SessionState | None = None) -> bool:
        """Block until every queued pre-position has finished; re-raises `session`'s background failure."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        if session is not None:
            self._raise_for(session)
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

    def _ids(self, values: Any, name: str) -> tuple[int, ...]:
        ids = token_ids(values, name)
        if self.vocab_size is not None and any(t >= self.vocab_size for t in ids):
            bad = next(t for t in ids if t >= self.vocab_size)
            raise ValueError(f"{name}: token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        return ids

    def _track(self, session: SessionState) -> None:
        with self._sessions_lock:
            self._sessions.add(session)

    def _decode(self, token: int) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode([token])

    def _raise_for(self, session: SessionState) -> None:
        err = session.take_background_error()
        if err is not None:
            raise RuntimeError(f"a background pre-position failed for this session: {err!r}") from err
