"""Request bookkeeping of the embedded engine: what a request asks for and what it has produced so far.

    notion                                     code
    what the request is for                    RequestMode: GENERATE, LOGITS (next_token_logits), PIN
                                               (pin), COMMAND (a closure run on the worker thread)
    prompt x, its length n                     Request.input_ids, len(input_ids)
    KV held (fed tokens), next token to feed   Request.kv_len, Request.next_token
    prefix KV read in place (shared segments)  Request.prefix, Request.prefix_len (see batch)
    y_t, log q_τ(y_t), log p0(y_t), H_t        Request.output_ids, .logq, .logp0, .entropy
    first scored prompt position s             Request.input_logprob_start (-1: none)
    sampling seed of u(seed, p)                Request.seed (the request's, or a fresh random one)
    parse state of a constrained request       Request.grammar (grammar.RowGrammar; None when unconstrained)
"""

from __future__ import annotations

import enum
import math
import operator
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..protocol import EngineError, SamplingParams, as_integer
from .radix_cache import RadixNode


class RequestMode(enum.Enum):
    """What a request does once its prompt KV is computed."""

    GENERATE = "generate"
    """Decode tokens (or only score the prompt when max_new_tokens = 0); the result is a GenerateOutput."""
    LOGITS = "logits"
    """Return the raw logits at the last prompt position (float64 numpy array)."""
    PIN = "pin"
    """Keep the prompt's KV resident until unpinned; the result is the pin handle."""
    COMMAND = "command"
    """No prompt: a closure run on the worker thread between steps (unpin, flush, stats)."""


@dataclass(eq=False)
class Request:
    """One request's parameters, its result slot for the waiting caller, and its progress (worker thread)."""

    rid: str
    input_ids: tuple[int, ...]
    params: SamplingParams
    priority: int
    seed: int
    mode: RequestMode
    submitted: float = field(default_factory=time.perf_counter)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    aborted: bool = False
    # runtime
    node: RadixNode | None = None
    reserved: int = 0
    held_prefix: RadixNode | None = None
    """The cached prefix its admission locked and did not charge to its reservation, until its prefill."""
    cached_tokens: int = 0
    kv_len: int = 0
    prefix: list[Any] = field(default_factory=list)
    prefix_len: int = 0
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
    grammar: Any = None
    """grammar.RowGrammar of a constrained request (regex / json_schema / ebnf), else None."""
    # streaming (runtime extension, `row_streams`): progress listener and the running row to share KV from
    listener: Any = None
    share_from: str | None = None
    """rid of the running row whose KV this request's prompt starts with; cleared once shared (before admission)."""

    @property
    def input_logprob_start(self) -> int:
        """s, or -1 when no prompt position is scored (also at s = n: SGLang then returns empty input lists)."""
        p = self.params
        return p.logprob_start_len if (p.return_logprob and 0 <= p.logprob_start_len < len(self.input_ids)) else -1

    @property
    def decodes(self) -> bool:
        """Whether the request occupies a decode row (logits, pin and scoring requests never do)."""
        return self.mode is RequestMode.GENERATE and self.params.max_new_tokens > 0

    @property
    def remaining(self) -> int:
        """Tokens still to generate at most."""
        return self.params.max_new_tokens - len(self.output_ids)

    def record_token(self, token: int, logq: float, logp0: float, entropy: float,
                     logq_by_temperature: list[float] | None, top: list[list[Any]] | None) -> None:
        """Append one generated token and its per-token quantities; it is the next token to feed."""
        self.output_ids.append(token)
        self.logq.append(logq)
        self.logp0.append(logp0)
        self.entropy.append(entropy)
        if logq_by_temperature is not None:
            self.logq_by_temperature.append(logq_by_temperature)
        if top is not None:
            self.top.append(top)
        self.next_token = token


def command_request() -> Request:
    """The bookkeeping of a command (a closure the worker runs): no prompt, only done/result/error."""
    return Request(rid=uuid.uuid4().hex, input_ids=(), params=SamplingParams(), priority=0, seed=0,
                   mode=RequestMode.COMMAND)


def make_request(input_ids: Sequence[int], params: SamplingParams, *, rid: str | None, priority: int,
                 mode: RequestMode, vocab_size: int, max_context: int) -> Request:
    """A validated request (EngineError names the request and the bad field); a fresh seed when none."""
    rid = rid if rid is not None else uuid.uuid4().hex
    if not isinstance(params, SamplingParams):
        raise EngineError(f"request {rid}: params must be a forerun SamplingParams, got {type(params).__name__}")
    try:
        ids = tuple(operator.index(i) for i in input_ids)  # a float id is refused, not truncated
    except TypeError as exc:
        raise EngineError(f"request {rid}: input_ids must be integers ({exc})") from exc
    if not ids:
        raise EngineError(f"request {rid}: empty prompt (input_ids is empty)")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise EngineError(f"request {rid}: token id {bad[0]} outside the vocabulary [0, {vocab_size})")
    penalties = [n for n in ("frequency_penalty", "presence_penalty") if getattr(params, n) != 0.0]
    if penalties:
        raise EngineError(f"request {rid}: {' and '.join(penalties)} are not implemented by the embedded engine "
                          "(an SGLang server applies them: the server backend sends them)")
    if params.temperature < 0 or not math.isfinite(params.temperature):
        raise EngineError(f"request {rid}: temperature must be a finite number >= 0, got {params.temperature}")
    total = len(ids) + params.max_new_tokens
    if total > max_context:
        raise EngineError(
            f"request {rid}: prompt ({len(ids)} tokens) + max_new_tokens ({params.max_new_tokens}) = {total} "
            f"exceeds the model context {max_context}"
        )
    if params.return_logprob and params.logprob_start_len > len(ids):  # SGLang's scheduler: only beyond it aborts
        raise EngineError(
            f"request {rid}: logprob_start_len {params.logprob_start_len} must be <= the prompt length {len(ids)}"
        )
    try:
        priority = as_integer("priority", priority)  # 1.7 is refused, not truncated
    except ValueError as exc:
        raise EngineError(f"request {rid}: {exc}") from None
    seed = params.seed if params.seed is not None else secrets.randbits(63)
    return Request(rid=rid, input_ids=ids, params=params, priority=priority, seed=int(seed), mode=mode)
