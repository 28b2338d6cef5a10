"""Stateful sessions with speculative pre-positioning: streaming and agentic (pre-positioning paper §3.2, §3.5).

A session owns a persistent token state — a frozen system region, the streamed data or the conversation,
and committed turns — its version and its live end n_s (`SessionState`).  Its KV stays resident: the
session pins its state in the engine's radix cache while it lives (`engine.pin` / `engine.unpin` when the
engine offers them; on the SGLang server, `--enable-session-radix-cache` evicts session entries last) and
releases it on close.

* `StreamingSession`: `append_data(batch)` commits an update and pre-positions the data decision point.
  Its entry is the registered standing query's prefix + the assistant header, or the generic header
  alone when no query is registered.  Standing queries match it exactly (zero added risk); ad-hoc queries
  share the same ready distribution through the relaxed header match (the question-independent token,
  risk r(τ)); everything else falls through with the query folded into Δ.
* `AgenticSession`: `emit_tool_call(call)` commits the call and opens the idle window; the entry is the
  post-tool-call envelope (the tool-result framing; or the whole envelope up to the next assistant turn
  when the caller expects a known result).  `tool_result(payload)` resumes delta-only from it.

Both run on any `PrepositionEngine` (`runtime_ext.preposition.engines`): an engine with
`generate(ids, params, *, priority)` (the embedded engine, the SGLang server client) through
`EngineAdapter`, or any token-exact SGLang backend through `ProgramEngine`, whose two requests are the
`@sgl.function` programs `decision_point` (the 1-token temperature-0 generation with `top_logprobs_num=2`
from the session's ids, written as `token_ids(...)` markers) and `session_turn`.

    paper                                 code
    n_s, version t                        session.state.live_end, session.state.version
    E (streaming: query prefix + header)  StreamingSession.entry_ids()
    E (agentic: post-tool-call envelope)  AgenticSession.envelope_ids()
    Δ                                     ServeResult.delta
    decision point (Eq. 1)                decision_point (@sgl.function)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..runtime_ext.preposition.engines import PrepositionEngine, TopLogprobs, top_logprobs_at_decision_point
from ..runtime_ext.preposition.prepositioner import Prepositioner, ServeResult
from ..runtime_ext.protocol import GenerateOutput, SamplingParams
from ..runtime_ext.preposition.ready_cache import SessionState
from ..runtime_ext.backends.sglang_frontend import function, gen
from ..runtime_ext.backends.token_markers import token_ids


# ----------------------------------------------------------------------------------------------------
# @sgl.function programs
# ----------------------------------------------------------------------------------------------------
@function
def decision_point(s, state_ids: Sequence[int], entry_ids: Sequence[int]):
    """The ready distribution at p = n_s + L_entry: one temperature-0 token with the top-2 of p0."""
    s += token_ids(list(state_ids) + list(entry_ids))
    s += gen("ready", max_tokens=1, temperature=0.0, return_logprob=True, top_logprobs_num=2)


@function
def session_turn(s, state_ids: Sequence[int], entry_ids: Sequence[int], max_tokens: int = 1):
    """The normal path from the session state: greedy generation after the realized entry."""
    s += token_ids(list(state_ids) + list(entry_ids))
    s += gen("answer", max_tokens=max_tokens, temperature=0.0, return_logprob=True)


class ProgramEngine(PrepositionEngine):
    """`PrepositionEngine` on a token-exact SGLang backend: the ready distribution through `decision_point`,
    greedy generation through `session_turn`.

    The SGLang frontend carries no request priority, so pre-positions sent this way run at the backend's
    normal priority (use the backend's engine, through `EngineAdapter`, to get `priority=-1`).
    """

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.tokenizer = getattr(backend, "tokenizer", None)

    def ready_distribution(self, input_ids: Sequence[int], *, priority: int = -1) -> TopLogprobs:
        ids = list(input_ids)
        state = decision_point.run(state_ids=ids[:-1], entry_ids=ids[-1:], backend=self.backend)
        return top_logprobs_at_decision_point(self._output(state, "ready", ids))

    def generate(self, input_ids: Sequence[int], params: SamplingParams, *, priority: int = 0) -> GenerateOutput:
        if params.temperature != 0.0:
            raise ValueError(f"ProgramEngine runs greedy session turns only (temperature 0), got {params.temperature}")
        ids = list(input_ids)
        state = session_turn.run(state_ids=ids[:-1], entry_ids=ids[-1:], max_tokens=params.max_new_tokens,
                                 backend=self.backend)
        return self._output(state, "answer", ids)

    @staticmethod
    def _output(state: Any, name: str, ids: list[int]) -> GenerateOutput:
        meta = state.get_meta_info(name) or {}
        out_ids = tuple(int(e[1]) for e in meta.get("output_token_logprobs") or ())
        return GenerateOutput(input_ids=tuple(ids), output_ids=out_ids, text=state[name], meta_info=dict(meta))


# ----------------------------------------------------------------------------------------------------
# formats
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SessionFormat:
    """Text templates of a session's regions (ChatML, as SmolLM2-Instruct uses)."""

    system: str = "<|im_start|>system\n{system}<|im_end|>\n"
    """The frozen system region."""
    data: str = "<|im_start|>user\nNew data: {data}<|im_end|>\n"
    """One streamed data batch (a committed update)."""
    query: str = "<|im_start|>user\n{query}<|im_end|>\n"
    """A query prefix."""
    header: str = "<|im_start|>assistant\n"
    """The assistant header that opens an answer."""
    turn_end: str = "<|im_end|>\n"
    """Closes a committed assistant turn."""
    tool_call: str = "<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call><|im_end|>\n"
    """An emitted tool call, committed to the state."""
    tool_result_open: str = "<|im_start|>user\n<tool_response>\n"
    """The tool-result framing that precedes the payload (the start of the post-tool-call envelope)."""
    tool_result_close: str = "\n</tool_response><|im_end|>\n"
    """Framing after the payload; the envelope continues with `header`."""

    def __post_init__(self) -> None:
        for name, key in (("system", "{system}"), ("data", "{data}"), ("query", "{query}"), ("tool_call", "{call}")):
            if key not in getattr(self, name):
                raise ValueError(f"{name} template must contain {key}")
        if not self.header:
            raise ValueError("header must not be empty (the decision point needs an entry token)")


def _encode(tokenizer: Any, text: str) -> list[int]:
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


class _Session:
    """Shared plumbing: token state, pinning, the prepositioner."""

    def __init__(self, prepositioner: Prepositioner, tokenizer: Any, system: str, fmt: SessionFormat) -> None:
        if tokenizer is None:
            raise ValueError("a session needs a tokenizer (pass tokenizer= or use an engine that has one)")
        self.pp = prepositioner
        self.tokenizer = tokenizer
        self.fmt = fmt
        system_ids = _encode(tokenizer, fmt.system.format(system=system))
        self.state = SessionState(system_ids, frozen_len=len(system_ids))
        self._pin_lock = threading.Lock()
        self._pin_handle: Any = None
        self._pin()

    def encode(self, text: str) -> list[int]:
        return _encode(self.tokenizer, text)

    def _pin(self) -> None:
        """Keep the committed state's KV resident (radix-cache pin) and release the previous pin."""
        pin = getattr(self.pp.engine, "pin", None)
        unpin = getattr(self.pp.engine, "unpin", None)
        if pin is None or unpin is None:
            return
        with self._pin_lock:
            old = self._pin_handle
            self._pin_handle = pin(list(self.state.tokens)) if not self.state.closed else None
            if old is not None:
                unpin(old)

    def _commit(self, ids: Sequence[int]) -> None:
        self.state.append(ids)  # invalidates the ready distribution in the same critical section
        self._pin()

    def _continue(self, result: ServeResult, max_new_tokens: int) -> tuple[list[int], str]:
        """Tail generation after the first token ((m − 1) T_decode, unchanged by pre-positioning)."""
        first = [result.token_id]
        if max_new_tokens <= 1:
            return first, result.text
        ids = list(result.state) + list(result.entry) + first
        out = self.pp.runner.generate(ids, SamplingParams(max_new_tokens=max_new_tokens - 1, temperature=0.0),
                                      priority=0)
        return first + list(out.output_ids), self.tokenizer.decode(first + list(out.output_ids))

    def close(self) -> None:
        """Close the session: clears the ready distribution and releases the pinned KV."""
        self.state.close()
        self._pin()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StreamingSession(_Session):
    """A streaming analytical session: data batches in, single-token answers out (§3.2)."""

    def __init__(self, prepositioner: Prepositioner, *, tokenizer: Any = None, system: str = "You analyse a data stream.",
                 fmt: SessionFormat | None = None, allow_relaxed: bool = True) -> None:
        super().__init__(prepositioner, tokenizer if tokenizer is not None else prepositioner.tokenizer, system,
                         fmt or SessionFormat())
        self.allow_relaxed = allow_relaxed
        """Serve ad-hoc queries the standing/generic token when the header matches (the paper's relaxation)."""
        self.standing: dict[str, str] = {}
        self._primary: str | None = None

    def header_ids(self) -> list[int]:
        return self.encode(self.fmt.header)

    def query_entry(self, query: str) -> list[int]:
        """Realized entry of a query: query prefix + assistant header."""
        return self.encode(self.fmt.query.format(query=query)) + self.header_ids()

    def entry_ids(self) -> tuple[list[int], int]:
        """(E, header length): the primary standing query's entry, or the generic header alone."""
        header = self.header_ids()
        if self._primary is None:
            return header, len(header)
        return self.query_entry(self.standing[self._primary]), len(header)

    def register_query(self, name: str, query: str) -> None:
        """Register a standing query; the first registered one defines the pre-positioned entry."""
        if not name:
            raise ValueError("standing query name must be non-empty")
        self.standing[name] = query
        if self._primary is None:
            self._primary = name
            self.preposition()

    def append_data(self, batch: str) -> int:
        """Commit one data batch (invalidates) and pre-position the data decision point in idle time."""
        ids = self.encode(self.fmt.data.format(data=batch))
        self._commit(ids)
        self.preposition()
        return self.state.version

    def preposition(self) -> bool:
        entry, header_len = self.entry_ids()
        return self.pp.preposition(self.state, entry, header_len=header_len)

    def shift_window(self, n_drop: int) -> None:
        """Sliding-window shift of the streamed data (invalidates), then pre-position again."""
        self.state.shift_window(n_drop)
        self._pin()
        self.preposition()

    def rollback(self, n: int) -> None:
        """Discard the last n committed tokens (invalidates), then pre-position again."""
        self.state.rollback(n)
        self._pin()
        self.preposition()

    def ask(self, query: str, *, max_new_tokens: int = 1) -> ServeResult:
        """An ad-hoc query (Algorithm 2).  Read-only: the query is not committed to the stream."""
        return self.pp.serve(self.state, self.query_entry(query), allow_relaxed=self.allow_relaxed,
                             max_new_tokens=max_new_tokens)

    def ask_standing(self, name: str, *, max_new_tokens: int = 1) -> ServeResult:
        """A registered standing query: an exact entry match when it is the pre-positioned one."""
        if name not in self.standing:
            raise KeyError(f"no standing query named {name!r} (registered: {sorted(self.standing)})")
        return self.pp.serve(self.state, self.query_entry(self.standing[name]), allow_relaxed=self.allow_relaxed,
                             max_new_tokens=max_new_tokens)


@dataclass
class AgentTurn:
    """What `tool_result` returns: the first-token serve and the turn's whole greedy answer."""

    first: ServeResult
    output_ids: list[int] = field(default_factory=list)
    text: str = ""


class AgenticSession(_Session):
    """A tool-calling agent session: tool calls open idle windows; results resume delta-only (§3.5)."""

    def __init__(self, prepositioner: Prepositioner, *, tokenizer: Any = None,
                 system: str = "You are an agent that calls tools.", fmt: SessionFormat | None = None) -> None:
        super().__init__(prepositioner, tokenizer if tokenizer is not None else prepositioner.tokenizer, system,
                         fmt or SessionFormat())
        self._expected: str | None = None
        self._awaiting = False

    def user(self, text: str) -> None:
        """Commit a user turn."""
        self._commit(self.encode(self.fmt.query.format(query=text)))

    def envelope_ids(self, expected_result: str | None = None) -> list[int]:
        """E: the tool-result framing; with a known expected result, the whole envelope up to the next turn."""
        if expected_result is None:
            return self.encode(self.fmt.tool_result_open)
        return self.result_entry(expected_result)

    def result_entry(self, payload: str) -> list[int]:
        """Realized entry when `payload` returns: framing + payload + framing close + assistant header."""
        return (self.encode(self.fmt.tool_result_open) + self.encode(payload)
                + self.encode(self.fmt.tool_result_close) + self.encode(self.fmt.header))

    def emit_tool_call(self, call: str, *, expected_result: str | None = None) -> bool:
        """Commit the tool call and pre-position the post-tool-call envelope while the tool runs."""
        self._commit(self.encode(self.fmt.tool_call.format(call=call)))
        self._awaiting = True
        self._expected = expected_result
        return self.pp.preposition(self.state, self.envelope_ids(expected_result))

    def tool_result(self, payload: str, *, max_new_tokens: int = 16) -> AgentTurn:
        """Resume from the pre-paid envelope with only the delta; commit the result and the answer turn."""
        if not self._awaiting:
            raise RuntimeError("tool_result without a preceding emit_tool_call")
        entry = self.result_entry(payload)
        first = self.pp.serve(self.state, entry, max_new_tokens=1)
        ids, text = self._continue(first, max_new_tokens)
        self._commit(entry + ids + self.encode(self.fmt.turn_end))
        self._awaiting = False
        return AgentTurn(first=first, output_ids=ids, text=text)
