"""Pre-position on idle (Algorithm 1) and confidence-gated serve (Algorithm 2) over any engine.

After each session update the `Prepositioner` queues one background job at the lowest priority
(engine requests with `priority=-1`, which any arriving request pre-empts).  The job pre-positions each
entry of the decision point in turn: one forward pass over state ‖ E — `PrepositionEngine.ready_distribution`
(a 1-token temperature-0 request with `top_logprobs_num=2`), or the raw logit vector when the engine
offers `next_token_logits` and `keep_logits` is set — whose last-position output is the ready
distribution.  Right before each pass it checks the budget B (Algorithm 1 line 2: when the job runs, not
when it was queued) against what the pass will actually hold: the tokens of state ‖ E not already held
resident by a pin (`pinned_prefix`, when the engine reports it; a session's pinned state is charged once),
else L_entry.  It pins state ‖ E in the engine (the pre-paid entry, so that the Δ a fall-through reports is
really pre-paid) and records the distribution on the session only if the state is still the one the job
read.  A request then either gets one cached token (gate fired) or falls through to the engine, whose
radix cache restores the pre-paid entry so that only the delta Δ is prefilled (Eq. 5).

Best-effort (§3.2, §3.5): every engine request of a pre-position runs at the background priority, its pins
included (the embedded engine drops such a pin when a user request needs the room); an entry already held
at the current version is not computed again; an `EngineError` (no room, engine busy or closed) discards
that pre-position and nothing else.  A user request never fails because pre-positioning ran: `serve` never
raises a background failure.  Any other failure of a background job (a bug) is kept on its own session and
raised by that session's next `preposition` or `wait_idle(session=...)`, never another's.

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

import collections
import inspect
import itertools
import logging
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..protocol import EngineError, SamplingParams
from ..shutdown import close_at_exit
from .counters import PrepositionCounters
from .engines import PrepositionEngine, as_preposition_engine, context_limit, kv_headroom
from .gate import GateConfig, gate_decision, gate_fires
from .serve_result import ServePath, ServeReceipt, ServeResult, as_restored, fall_path
from .ready_cache import (
    Lookup,
    ReadyDistribution,
    Role,
    SessionState,
    ready_from_logits,
    ready_from_top_logprobs,
    token_ids,
)

log = logging.getLogger(__name__)
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
    """Keep the whole ready logit vector (needs `engine.next_token_logits`); else top-2 only (read from the
    logits when the engine offers `next_token_logits(ids, priority=...)`, else from its top-2 log-probs)."""
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
        pinned = getattr(engine, "pinned_prefix", None)
        self._pinned_prefix: Callable[[list[int]], int] | None = pinned if callable(pinned) else None
        logits_fn = getattr(engine, "next_token_logits", None)
        self._background_logits = callable(logits_fn) and _accepts_priority(logits_fn)
        """The ready distribution as a logits request at the background priority (no decode row to admit)."""
        self._pin_priority = callable(getattr(engine, "pin", None)) and _accepts_priority(engine.pin)
        self.max_context = context_limit(engine)
        """The engine's context window (sessions validate their commits against it), None if unknown."""
        self._sessions: "weakref.WeakSet[SessionState]" = weakref.WeakSet()
        self._sessions_lock = threading.Lock()
        self._left_behind: "collections.deque[Callable[[], list[Any]]]" = collections.deque()  # pins of dropped sessions
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
        with self._idle:  # checked and queued under the lock close() takes: never queued behind its sentinel
            if self._closed:
                raise RuntimeError("prepositioner is closed")
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
            self._release_invalidated_pins()  # before B is read: they are no live state
            for entry, role in jobs:
                if not self._still_current(job, session, version):
                    break  # a newer update arrived: nothing more is computed for this one
                with session.lock:
                    if session.closed or session.version != version:
                        break
                    state = session.tokens
                    held = session.ready_for(entry)
                if held is not None and held.role == role:
                    continue  # already pre-positioned at this version (e.g. a query registered since)
                try:
                    over = self._over_budget(self.hold_cost(state, entry))
                except EngineError as exc:  # the engine cannot say (closed, busy): skip, best-effort
                    log.debug("pre-position skipped: %s", exc)
                    over = True
                if over:
                    session.record_skip()  # valid stays false: no eviction of live state
                    continue
                with session.lock:
                    if session.closed or session.version != version:
                        break
                    session.begin_preposition()
                try:
                    ready, pin = self._forward_ready(version, state, entry, role)
                except EngineError as exc:  # no room, engine busy or closed: this pre-position only
                    session.abort_preposition()
                    log.debug("pre-position discarded: %s", exc)
                    continue
                except BaseException:
                    session.abort_preposition()
                    raise
                installed += session.install(ready, pin=pin)
                self.release_pins(session)
        except BaseException as exc:  # a bug: kept on its own session, raised by its next preposition/wait_idle
            log.warning("a background pre-position failed: %r", exc)
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

    def hold_cost(self, state: Sequence[int], entry: Sequence[int]) -> int:
        """KV tokens pre-positioning `entry` after `state` will hold: those of state ‖ E not already held by a
        pin (the engine's `pinned_prefix`), so a session's pinned state is charged once; L_entry when the
        engine cannot tell (a session keeps its own state pinned)."""
        if self._pinned_prefix is None:
            return len(entry)
        ids = list(state) + list(entry)
        return len(ids) - int(self._pinned_prefix(ids))

    def _over_budget(self, cost: int) -> bool:
        """Algorithm 1 line 2, evaluated when the job runs: the cost (`hold_cost`) > B."""
        budget = self.config.budget_headroom
        if self.headroom_fn is not None:
            dynamic = int(self.headroom_fn())
            budget = dynamic if budget is None else min(budget, dynamic)
        return budget is not None and cost > budget

    def _pin(self, ids: tuple[int, ...]) -> Any:
        """Pin state ‖ E at the background priority when the engine takes one (a pin the engine may drop for
        a user request), else as the engine pins."""
        pin, unpin = getattr(self.engine, "pin", None), getattr(self.engine, "unpin", None)
        if not self.config.pin_entries or pin is None or unpin is None:
            return None
        if self._pin_priority:
            return pin(list(ids), priority=self.config.background_priority)
        return pin(list(ids))

    def _unpin_quietly(self, handle: Any) -> None:
        unpin = getattr(self.engine, "unpin", None)
        if handle is None or unpin is None:
            return
        try:
            unpin(handle)
        except Exception as exc:  # a pin the engine no longer knows: nothing to release
            log.debug("unpin failed: %r", exc)

    def release_pins(self, session: SessionState) -> None:
        """Unpin the pre-paid entries that `session` invalidated or refused (outside its lock).  Never raises:
        a release is bookkeeping after a mutation that already happened."""
        for handle in session.take_released_pins():
            self._unpin_quietly(handle)

    def _release_invalidated_pins(self) -> None:
        """Unpin every tracked session's invalidated or refused pre-positions (`release_pins`), and every pin of a
        tracked session dropped without close (its finalizer queued them).  A bare `SessionState` cannot unpin them
        itself, and the engine counts a pin as held until it is released: left in place they shrink B (`kv_headroom`),
        and the next decision point, of any session, is skipped for the room a stale pre-position still takes."""
        with self._sessions_lock:
            sessions = list(self._sessions)
        for s in sessions:
            self.release_pins(s)
        while True:
            try:
                pins = self._left_behind.popleft()
            except IndexError:  # none left (another thread may have taken the last)
                break
            for handle in pins():
                self._unpin_quietly(handle)

    def _forward_ready(
        self, version: int, state: tuple[int, ...], entry: tuple[int, ...], role: Role
    ) -> tuple[ReadyDistribution, Any]:
        """One forward pass over state ‖ E at the lowest priority (Algorithm 1 lines 5-11), and the pin of
        state ‖ E (None when not pinned).

        On an engine with `next_token_logits(ids, priority=...)` (the embedded engine) the entry is pinned
        first and its logits read by a logits request: neither occupies a decode row, so the pre-position
        holds exactly the pinned tokens.  Otherwise a 1-token request with the top-2 log-probs, then the pin.
        """
        ids = state + entry
        logits_fn = getattr(self.engine, "next_token_logits", None)
        if self._background_logits:
            pin = self._pin(ids)
            try:
                logits = np.asarray(logits_fn(list(ids), priority=self.config.background_priority))
                ready = ready_from_logits(version, state, entry, logits, keep_logits=self.config.keep_logits,
                                          role=role)
            except BaseException:
                self._unpin_quietly(pin)
                raise
            return ready, pin
        if self.config.keep_logits:
            # this engine's logits call takes no priority: keep_logits trades the background priority for the
            # full vector (the vocabulary scan of Eq. 3 at serve time)
            if logits_fn is None:
                raise ValueError("keep_logits needs an engine with next_token_logits(ids)")
            logits = np.asarray(logits_fn(list(ids)))
            ready = ready_from_logits(version, state, entry, logits, keep_logits=True, role=role)
        else:
            top = self.runner.ready_distribution(ids, priority=self.config.background_priority)
            ready = ready_from_top_logprobs(version, state, entry, top, role=role)
        return ready, self._pin(ids)

    # -- Algorithm 2 ----------------------------------------------------------------------------------
    def serve(
        self, session: SessionState, realized_entry: Sequence[int], *, allow_relaxed: bool = False,
        max_new_tokens: int = 1, rid: str | None = None, record: bool = True,
    ) -> ServeResult:
        """Serve a request whose entry (query prefix + header, or envelope + payload) is `realized_entry`.

        Fast path iff a valid ready distribution matches the realized entry exactly (or, with
        `allow_relaxed`, the realized entry ends with the pre-positioned generic header: the header's
        question-independent token), the gate of Eq. 12 fires and `max_new_tokens` = 1 (Algorithm 2 serves
        one token): one cached token, no engine call.  Otherwise the engine generates `max_new_tokens` tokens
        from state ‖ realized entry at normal priority, as a fresh request would; its radix cache restores the
        pre-paid prefix (Δ = 0 for an exact match).

        Read-only until it has succeeded: a serve that raises counted nothing.  Its counters (and the hits
        on the distributions it read) are recorded on return, or, with `record=False`, left to the caller's
        `record(session, result)` (a turn records the serve it commits on, in its commit).
        """
        t0 = time.perf_counter()
        realized = self._ids(realized_entry, "realized_entry")
        if not realized:
            raise ValueError("realized_entry must hold at least one token")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        self._track(session)
        look = session.lookup(realized, allow_relaxed=allow_relaxed, consume=False)
        gap: float | None = None
        reason = ""
        if look.ready is not None and look.match in ("exact", "relaxed"):
            token, gap = look.ready.scan()
            fires = gate_fires(gap, token, self.config.gate)
            if fires and max_new_tokens == 1:
                result = self._fast(look, token, gap, t0)
                if record:
                    self.record(session, result)
                return result
            reason = gate_decision(gap, token, self.config.gate, token_text=self._decode(token)).reason
            if fires:
                reason += f", but the fast path serves one token and the request asks for {max_new_tokens}"
        path, delta, reason, receipt = fall_path(look, realized, reason)
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=max_new_tokens == 1)
        out = self.runner.generate(look.state + realized, params, priority=0)
        if not out.output_ids:
            raise RuntimeError("engine returned no output token for a served request")
        latency = time.perf_counter() - t0
        cached = out.meta_info.get("cached_tokens")
        if cached:  # 0: no cache hit reported at all (a server client's default, a cache-less server): says nothing
            delta, reason = as_restored(delta, reason, len(look.state), len(realized), int(cached),
                                        fell_through=path == "fall")
        result = ServeResult(
            path=path, token_id=int(out.output_ids[0]), text=out.text, latency_s=latency, logit_gap=gap,
            delta=delta, state=look.state, entry=realized, cached_tokens=None if cached is None else int(cached),
            output=out, version=look.version, match=look.match, reason=reason, receipt=receipt,
        )
        if record:
            self.record(session, result)
        self.release_pins(session)
        return result

    @staticmethod
    def record(session: SessionState, result: ServeResult) -> None:
        """Count `result` on its session: its serve counter, and a hit on each distribution it read that is
        still held (one invalidated meanwhile stays counted as invalidated).  Never raises."""
        receipt = result.receipt
        if receipt is None:
            return
        with session.lock:
            for ready in receipt.consumed:
                session.consume(ready)
            session.count(receipt.counter)

    def _fast(self, look: Lookup, token: int, gap: float, t0: float) -> ServeResult:
        """Algorithm 2 line 7: one cached token, no scheduler, no decode."""
        assert look.ready is not None
        path: ServePath = "fast" if look.match == "exact" else "fast_relaxed"
        # an exact match is a hit; a relaxed match only when its token is served (here)
        receipt = ServeReceipt((look.ready,), "served_fast" if path == "fast" else "served_fast_relaxed")
        text = self._answer_text(token)
        latency = time.perf_counter() - t0
        why = gate_decision(gap, token, self.config.gate, token_text=self._decode(token)).reason
        if path == "fast_relaxed":
            why = "relaxed match (question-independent header token); " + why
        return ServeResult(path=path, token_id=token, text=text, latency_s=latency, logit_gap=gap, delta=0,
                           state=look.state, entry=look.ready.entry_ids, version=look.version, match=look.match,
                           reason=why, receipt=receipt)

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
        with self._idle:
            if self._closed:
                return
            self._closed = True
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
            if session not in self._sessions:
                self._sessions.add(session)
                weakref.finalize(session, self._left_behind.append, session.pins_left_behind())

    def _decode(self, token: int) -> str:
        """The token as written (special tokens by name): for the gate's explanation."""
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode([token])

    def _answer_text(self, token: int) -> str:
        """A served token's text as a fresh request returns it: the engines (the embedded one, like an SGLang
        server) skip special tokens in `text`, so an EOS or `<|im_start|>` answer is ''."""
        return self.tokenizer.decode([token], skip_special_tokens=True) if self.tokenizer is not None else ""

    def _raise_for(self, session: SessionState) -> None:
        """Raise `session`'s kept background failure (a bug, not a lack of room), once."""
        err = session.take_background_error()
        if err is not None:
            raise RuntimeError(f"a background pre-position failed for this session: {err!r}") from err


def _accepts_priority(fn: Callable[..., Any]) -> bool:
    """Whether `fn` takes a `priority` keyword (the embedded engine's pin and logits requests do)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "priority" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
