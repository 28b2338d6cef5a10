"""Stateful sessions with speculative pre-positioning: streaming and agentic (pre-positioning paper §3.2, §3.5).

A session owns a persistent token state — a frozen system region, the streamed data or the conversation,
and committed turns — its version and its live end n_s (`SessionState`).  Its KV stays resident: the
session pins its state in the engine's radix cache while it lives (`engine.pin` / `engine.unpin` when the
engine offers them; on the SGLang server, `--enable-session-radix-cache` evicts session entries last) and
releases it on close.

* `StreamingSession`: `append_data(batch)` commits an update and pre-positions the data decision point:
  every registered standing query's own entry (query prefix + assistant header; exact match, zero added
  risk), most recently used first and within the budget, and the generic header alone (§2.1: the
  question-independent distribution).  Ad-hoc queries and standing queries left out by the budget are
  served the header's token through the relaxed match (risk r(τ), §3.4) or take their own full path,
  never another query's.
* `AgenticSession`: `emit_tool_call(call)` commits the call and opens the idle window; the entries are
  the post-tool-call envelope (the tool-result framing) and the whole envelope for the results it
  predicts (§3.5).  `tool_result(payload)` is served from a predicted entry or resumes delta-only.

Every mutation is all-or-nothing: validated first (context window, protocol), then reserved (the new
state's KV pinned), then committed; one that raises changed nothing, so a retry applies it exactly once.
Pre-positioning after a commit is best-effort and never raises.  User content is encoded with special-token
parsing off, without ever touching the shared tokenizer (`session_text`); every public operation of a
session is atomic.

Both run on any `PrepositionEngine` (`runtime_ext.preposition.engines`): an engine with
`generate(ids, params, *, priority)` (the embedded engine, the SGLang server client) through
`EngineAdapter`, or any token-exact SGLang backend through `ProgramEngine` (`session_programs`), whose two
requests are the `@sgl.function` programs `decision_point` (the 1-token temperature-0 generation with
`top_logprobs_num=2` from the session's ids, written as `token_ids(...)` markers) and `session_turn`.

    paper                                 code
    n_s, version t                        session.state.live_end, session.state.version
    E (streaming: query prefix + header)  StreamingSession.entries() (standing queries' entries, header)
    E (agentic: post-tool-call envelope)  AgenticSession.envelope_ids(), .result_entry(predicted payload)
    Δ                                     ServeResult.delta
    decision point (Eq. 1)                decision_point (@sgl.function, `session_programs`)
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..runtime_ext.preposition.engines import turn_stop_ids
from ..runtime_ext.preposition.prepositioner import Prepositioner
from ..runtime_ext.preposition.serve_result import ServeResult
from ..runtime_ext.protocol import SamplingParams
from ..runtime_ext.preposition.ready_cache import ContextOverflow, SessionState
from .session_programs import ProgramEngine, decision_point, session_turn
from .session_text import SessionFormat, encode_content, encode_framing, render, render_message

log = logging.getLogger(__name__)

__all__ = ["AgentTurn", "AgenticSession", "ProgramEngine", "SessionFormat", "StreamingSession", "ToolCallPending",
           "decision_point", "session_turn", "tool_name"]


# ----------------------------------------------------------------------------------------------------
# sessions
# ----------------------------------------------------------------------------------------------------
class ToolCallPending(RuntimeError):
    """The agentic protocol was broken: a tool call is pending (emit -> result -> emit ...)."""


class _Session:
    """Shared plumbing: token state, pinning, the prepositioner, the turn lock, injection-safe encoding.

    Every public operation of a session runs under its turn lock, so operations from several threads
    are serialized: each one validates, computes and commits against one state (atomic turns).

    Every mutation is all-or-nothing, in three steps: validate (encode, context window, protocol), reserve
    (pin the new state's KV in the engine: an engine that cannot keep it resident raises here), commit
    (`SessionState` changes the tokens, bumps the version and clears the ready distributions in one
    critical section).  Whatever raises raises before the commit and leaves the state, its version and the
    session's bookkeeping as they were, so retrying a failed call applies it exactly once.  What follows a
    commit (releasing the old pins, pre-positioning) is best-effort and never raises: a failed
    pre-position is logged and kept in `preposition_error`.
    """

    def __init__(self, prepositioner: Prepositioner, tokenizer: Any, system: str, fmt: SessionFormat,
                 history: Sequence[tuple[str, str]] = ()) -> None:
        if tokenizer is None:
            raise ValueError("a session needs a tokenizer (pass tokenizer= or use an engine that has one)")
        self.pp = prepositioner
        self.tokenizer = tokenizer
        self._stops = turn_stop_ids(prepositioner.engine, tokenizer)
        self.fmt = fmt
        self._lock = threading.RLock()
        system_ids = render(tokenizer, fmt.system, "system", system)
        for role, content in history:  # frozen too: e.g. few-shot examples
            system_ids += render_message(tokenizer, fmt, role, content)
        self.state = SessionState(system_ids, frozen_len=len(system_ids), max_len=prepositioner.max_context)
        self.preposition_error: BaseException | None = None
        """The last failure of a pre-position this session started after a commit (best-effort, not raised)."""
        self._pin_handle: Any = self._pin_tokens(self.state.tokens)

    def encode(self, text: str) -> list[int]:
        """Framing text (special tokens parsed): use `render` / `encode_content` for user content."""
        return encode_framing(self.tokenizer, text)

    # -- validate, reserve, commit ----------------------------------------------------------------
    def _pin_tokens(self, tokens: Sequence[int]) -> Any:
        """Reserve: keep `tokens` resident in the engine's radix cache (None when the engine cannot pin)."""
        pin = getattr(self.pp.engine, "pin", None)
        if pin is None or getattr(self.pp.engine, "unpin", None) is None:
            return None
        return pin(list(tokens))

    def _unpin_quietly(self, handle: Any) -> None:
        unpin = getattr(self.pp.engine, "unpin", None)
        if handle is None or unpin is None:
            return
        try:
            unpin(handle)
        except Exception as exc:  # after a commit nothing may raise: a leaked pin is only held memory
            log.warning("releasing a session pin failed: %r", exc)

    def _mutate(self, new_tokens: Sequence[int], commit: Callable[[], int]) -> int:
        """Reserve the KV of `new_tokens` (the state `commit` will leave), then commit; on any failure the
        reservation is given back and the state is untouched.  After the commit: release the old pin and
        the invalidated entries' pins (never raises)."""
        handle = self._pin_tokens(new_tokens)
        try:
            version = commit()
        except BaseException:
            self._unpin_quietly(handle)
            raise
        old, self._pin_handle = self._pin_handle, handle
        self._unpin_quietly(old)
        self.pp.release_pins(self.state)
        return version

    def _commit(self, ids: Sequence[int], *, reserve: int = 0, expect_version: int | None = None,
                before_commit: Callable[[], None] | None = None) -> int:
        """Validate, reserve and commit `ids` at the live end (invalidates the ready distributions in the
        same critical section); returns the new version."""
        version, tokens = self.state.snapshot()
        expect = version if expect_version is None else expect_version
        self.state.check_append(len(ids), reserve=reserve)
        return self._mutate(tokens + tuple(ids), lambda: self.state.append(
            ids, reserve=reserve, expect_version=expect, before_commit=before_commit))

    def _preposition_quietly(self, *entries: Sequence[int], header: Sequence[int] | None = None) -> bool:
        """Pre-position after a commit: best-effort, never raises (the commit stands either way)."""
        try:
            return self.pp.preposition(self.state, *entries, header=header)
        except Exception as exc:
            log.warning("pre-positioning after a commit failed (the commit stands): %r", exc)
            self.preposition_error = exc
            return False

    def _check_room(self, extra: int, what: str) -> None:
        """ContextOverflow unless `extra` more tokens fit after the state (checked before anything runs)."""
        limit = self.state.max_len
        if limit is not None and self.state.live_end + extra > limit:
            raise ContextOverflow(f"{what} needs {extra} tokens after the {self.state.live_end}-token state: over "
                                  f"the context window {limit}; nothing was served or committed")

    def _continue(self, result: ServeResult, max_new_tokens: int) -> tuple[list[int], str]:
        """Tail generation after the first token ((m − 1) T_decode, unchanged by pre-positioning): the ids and
        text a fresh greedy request returns (a stop token ends it, kept in the ids, not in the text)."""
        ids = [result.token_id]
        if max_new_tokens > 1 and result.token_id not in self._stops:
            out = self.pp.runner.generate(list(result.state) + list(result.entry) + ids,
                                          SamplingParams(max_new_tokens=max_new_tokens - 1, temperature=0.0),
                                          priority=0)
            ids += list(out.output_ids)
        return ids, self.tokenizer.decode(ids, skip_special_tokens=True)

    def _turn_body(self, ids: Sequence[int]) -> list[int]:
        """An answer's ids as the conversation keeps them: without the stop token that ended it (the turn end
        the template writes after it closes the turn)."""
        return list(ids[:-1]) if ids and ids[-1] in self._stops else list(ids)

    def _shift_or_rollback(self, kind: str, n: int) -> int:
        """Validate, reserve and commit a sliding-window shift or a rollback (invalidates)."""
        with self.state.lock:
            version = self.state.version
            new = self.state.after_shift(n) if kind == "shift" else self.state.after_rollback(n)
        if kind == "shift":
            return self._mutate(new, lambda: self.state.shift_window(n, expect_version=version))
        return self._mutate(new, lambda: self.state.rollback(n, expect_version=version))

    def close(self) -> None:
        """Close the session: clears the ready distributions and releases the pinned KV (idempotent)."""
        with self._lock:
            if self.state.closed:
                return
            self.state.close()
            handle, self._pin_handle = self._pin_handle, None
            self._unpin_quietly(handle)
            self.pp.release_pins(self.state)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StreamingSession(_Session):
    """A streaming analytical session: data batches in, single-token answers out (§3.2).

    Each update pre-positions every registered standing query's entry (query prefix + header: its own
    ready distribution, exact match), most recently used first, at most `max_prepositioned_queries` of
    them and each within the engine's budget B; and, with `allow_relaxed` or when no query is registered,
    the generic header alone (the question-independent distribution, §2.1).  A standing query that was
    not pre-positioned and an ad-hoc query are served the header's token through the relaxed match (risk
    r(τ), §3.4) or take their own full path; a query never gets another query's token.
    """

    def __init__(self, prepositioner: Prepositioner, *, tokenizer: Any = None, system: str = "You analyse a data stream.",
                 fmt: SessionFormat | None = None, allow_relaxed: bool = True,
                 history: Sequence[tuple[str, str]] = (), max_prepositioned_queries: int | None = None) -> None:
        if max_prepositioned_queries is not None and (isinstance(max_prepositioned_queries, bool)
                                                      or not isinstance(max_prepositioned_queries, int)
                                                      or max_prepositioned_queries < 0):
            raise ValueError(f"max_prepositioned_queries must be an integer >= 0 or None, got {max_prepositioned_queries!r}")
        super().__init__(prepositioner, tokenizer if tokenizer is not None else prepositioner.tokenizer, system,
                         fmt or SessionFormat(), history)
        self.allow_relaxed = allow_relaxed
        """Pre-position the generic header too and serve ad-hoc queries its token (the paper's relaxation)."""
        self.max_prepositioned_queries = max_prepositioned_queries
        """Most standing queries pre-positioned per update, most recently used first (None: all of them)."""
        self.standing: dict[str, str] = {}
        self._recent: OrderedDict[str, None] = OrderedDict()
        """Standing query names, least recently used (registered or asked) first."""
        self._recent_lock = threading.Lock()

    def header_ids(self) -> list[int]:
        return self.encode(self.fmt.header)

    def query_entry(self, query: str) -> list[int]:
        """Realized entry of a query: query prefix + assistant header."""
        return render(self.tokenizer, self.fmt.query, "query", query) + self.header_ids()

    def standing_order(self) -> list[str]:
        """Standing query names, most recently used (registered or asked) first."""
        with self._recent_lock:
            return list(reversed(self._recent))

    def entries(self) -> tuple[list[list[int]], list[int] | None]:
        """(the standing queries' entries to pre-position, most recently used first and at most
        `max_prepositioned_queries` of them; the generic header or None) for the next update."""
        names = self.standing_order()
        if self.max_prepositioned_queries is not None:
            names = names[: self.max_prepositioned_queries]
        queries = [self.query_entry(self.standing[n]) for n in names]
        header = self.header_ids() if (self.allow_relaxed or not self.standing) else None
        return queries, header

    def _reserve(self) -> int:
        """Room a commit must leave: the longest entry a request can bring (any standing query or the
        header) plus the answer token."""
        return max([len(self.header_ids())] + [len(self.query_entry(q)) for q in list(self.standing.values())]) + 1

    def _used(self, name: str) -> None:
        with self._recent_lock:
            self._recent[name] = None
            self._recent.move_to_end(name)

    def register_query(self, name: str, query: str) -> None:
        """Register (or re-register) a standing query: pre-positioned at the current state and after every
        update from now on (most recently used first)."""
        if not isinstance(name, str) or not name:
            raise ValueError("standing query name must be a non-empty string")
        with self._lock:
            self.state.snapshot()  # SessionClosed on a closed session
            entry = self.query_entry(query)  # ValueError for content that is not text
            self._check_room(len(entry) + 1, f"standing query {name!r}")
            self.standing[name] = query
            self._used(name)
            self._repreposition()

    def append_data(self, batch: str, *, preposition: bool = True) -> int:
        """Commit one data batch (validated, invalidates) and pre-position the data decision point
        (`preposition=False`: a bulk ingest whose last batch opens the idle window; call `preposition()`)."""
        with self._lock:
            ids = render(self.tokenizer, self.fmt.data, "data", batch)
            version = self._commit(ids, reserve=self._reserve())
            if preposition:
                self._repreposition()
            return version

    def preposition(self) -> bool:
        """Pre-position the decision point at the live end now (raises what the prepositioner raises)."""
        with self._lock:
            queries, header = self.entries()
            if not queries and header is None:
                return False
            return self.pp.preposition(self.state, *queries, header=header)

    def _repreposition(self) -> bool:
        """Pre-position the decision point after a commit (best-effort, never raises)."""
        queries, header = self.entries()
        if not queries and header is None:
            return False
        return self._preposition_quietly(*queries, header=header)

    def shift_window(self, n_drop: int) -> None:
        """Sliding-window shift of the streamed data (invalidates), then pre-position again."""
        with self._lock:
            self._shift_or_rollback("shift", n_drop)
            self._repreposition()

    def rollback(self, n: int) -> None:
        """Discard the last n committed tokens (invalidates), then pre-position again."""
        with self._lock:
            self._shift_or_rollback("rollback", n)
            self._repreposition()

    def ask(self, query: str, *, max_new_tokens: int = 1) -> ServeResult:
        """An ad-hoc query (Algorithm 2), read-only; max_new_tokens > 1 is generated whole (`Prepositioner.serve`)."""
        entry = self.query_entry(query)
        self._check_room(len(entry) + max_new_tokens, "the query")
        return self.pp.serve(self.state, entry, allow_relaxed=self.allow_relaxed, max_new_tokens=max_new_tokens)

    def ask_standing(self, name: str, *, max_new_tokens: int = 1) -> ServeResult:
        """A registered standing query: an exact entry match when it is pre-positioned (its own answer)."""
        query = self.standing.get(name)
        if query is None:
            raise KeyError(f"no standing query named {name!r} (registered: {sorted(self.standing)})")
        self._used(name)
        return self.ask(query, max_new_tokens=max_new_tokens)


@dataclass
class AgentTurn:
    """What `tool_result` returns: the first-token serve and the turn's whole greedy answer."""

    first: ServeResult
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    predicted: bool = False
    """Whether the result was one the session had pre-positioned (history or `expected_result`)."""


@dataclass(frozen=True)
class _PendingCall:
    call: str
    tool: str
    candidates: tuple[str, ...]


def tool_name(call: str) -> str:
    """The tool a call names (`{"name": ...}` JSON), else the call text itself."""
    try:
        obj = json.loads(call)
    except (TypeError, ValueError):
        return call
    return str(obj.get("name", call)) if isinstance(obj, dict) else call


class AgenticSession(_Session):
    """A tool-calling agent session: tool calls open idle windows; results resume delta-only (§3.5).

    While the tool runs the session pre-positions what is known of the next entry: the tool-result
    framing (pre-paid: the result resumes delta-only from it) and, for up to `predict_results` payloads
    this call or tool returned before (or a caller's `expected_result`), the whole realized entry
    framing + payload + close + header, whose ready distribution the gate can serve at once when the
    real result equals it (an exact match: zero added risk).  The protocol is emit_tool_call ->
    tool_result -> ...; each call is atomic and all-or-nothing, and a second emit while a call is pending
    raises.
    """

    def __init__(self, prepositioner: Prepositioner, *, tokenizer: Any = None,
                 system: str = "You are an agent that calls tools.", fmt: SessionFormat | None = None,
                 predict_results: int = 2) -> None:
        if predict_results < 0:
            raise ValueError(f"predict_results must be >= 0, got {predict_results}")
        super().__init__(prepositioner, tokenizer if tokenizer is not None else prepositioner.tokenizer, system,
                         fmt or SessionFormat())
        self.predict_results = predict_results
        self._pending: _PendingCall | None = None
        self._seen: dict[str, Counter[str]] = {}
        """Results seen per call text and per tool name (the predictor's only memory)."""

    def user(self, text: str) -> None:
        """Commit a user turn."""
        with self._lock:
            self._no_pending("user")
            self._commit(render(self.tokenizer, self.fmt.query, "query", text))

    def call_ids(self, call: str) -> list[int]:
        """The committed tokens of a tool call (framing parsed, the call itself as plain content)."""
        return render(self.tokenizer, self.fmt.tool_call, "call", call)

    def envelope_ids(self) -> list[int]:
        """E: the tool-result framing that precedes any payload (known before the result)."""
        return self.encode(self.fmt.tool_result_open)

    def result_entry(self, payload: str) -> list[int]:
        """Realized entry when `payload` returns: framing + payload + framing close + assistant header."""
        return (self.envelope_ids() + encode_content(self.tokenizer, payload)
                + self.encode(self.fmt.tool_result_close) + self.encode(self.fmt.header))

    def predicted_results(self, call: str) -> list[str]:
        """Up to `predict_results` payloads to pre-position: those this exact call, then this tool, returned
        most often before (ties: the earlier first)."""
        out: list[str] = []
        for key in (call, tool_name(call)):
            for payload, _ in sorted(self._seen.get(key, Counter()).items(), key=lambda kv: -kv[1]):
                if payload not in out and len(out) < self.predict_results:
                    out.append(payload)
        return out

    def emit_tool_call(self, call: str, *, expected_result: str | None = None) -> bool:
        """Commit the tool call and pre-position the post-tool-call envelope while the tool runs.

        Returns whether the pre-position was queued (or, inline, installed); a pre-position that fails is
        best-effort and leaves the committed call standing."""
        with self._lock:
            self._no_pending("emit_tool_call")
            candidates = list(dict.fromkeys(([expected_result] if expected_result is not None else [])
                                            + self.predicted_results(call)))
            entries = [self.envelope_ids()] + [self.result_entry(c) for c in candidates]
            self._commit(self.call_ids(call), reserve=max(len(e) for e in entries) + 1)
            self._pending = _PendingCall(call, tool_name(call), tuple(candidates))
            return self._preposition_quietly(*entries)

    def tool_result(self, payload: str, *, max_new_tokens: int = 16) -> AgentTurn:
        """Resume from the pre-paid envelope with only the delta; commit the result and the answer turn.

        Validated first (the whole turn must fit the context window); the answer is committed only onto
        the state it was computed from (`expect_version`), and the serve is counted in that commit, so a
        failed turn leaves the call pending, the state and the counters untouched.
        """
        with self._lock:
            pending = self._pending
            if pending is None:
                raise RuntimeError("tool_result without a preceding emit_tool_call")
            if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
                raise ValueError(f"max_new_tokens must be an integer >= 1 (a turn answers), got {max_new_tokens!r}")
            entry = self.result_entry(payload)
            end = self.encode(self.fmt.turn_end)
            self._check_room(len(entry) + max_new_tokens + len(end), "the tool result and its answer")
            first = self.pp.serve(self.state, entry, max_new_tokens=1, record=False)
            ids, text = self._continue(first, max_new_tokens)
            self._commit(entry + self._turn_body(ids) + end, expect_version=first.version,
                         before_commit=lambda: self.pp.record(self.state, first))
            self._pending = None
            for key in (pending.call, pending.tool):
                self._seen.setdefault(key, Counter())[payload] += 1
            return AgentTurn(first=first, output_ids=ids, text=text, predicted=payload in pending.candidates)

    def rollback(self, n: int) -> None:
        """Discard the last n committed tokens (invalidates; not while a tool call is pending)."""
        with self._lock:
            self._no_pending("rollback")
            self._shift_or_rollback("rollback", n)

    def _no_pending(self, what: str) -> None:
        if self._pending is not None:
            raise ToolCallPending(f"{what}: the tool call {self._pending.call!r} is pending; deliver its "
                                  "tool_result first (one tool call at a time per session)")
