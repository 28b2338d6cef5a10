"""Streamed suffix proposals: the rows of streaming PreSTO, started one by one and heard token by token.

`ProposalStreams` is what the streaming sampler (`streaming_presto`) needs from an engine: start a suffix request
now (optionally naming a running row whose tokens its prefix extends, so the engine can share that KV),
abort one, and wait for the next progress (`RowUpdate`: the tokens so far; the `Suffix` once complete).
`EngineStreams` provides it on any `protocol.StreamingEngine` (the embedded engine; an SGLang server
client), with the same request parameters as the `suffix_proposals` program (exact ids, the request's seed,
full-vocabulary q_τ, EOS ignored) and the same meta_info reading, so a streamed row's suffix is the suffix
the program would return for that request.

On the embedded engine the rows advance in lockstep with the consumer (`lockstep=True`): the engine's
listener hands over each decode step's events and waits until the sampler has reacted (started the
children that became feasible, aborted what became unreachable), so a child joins the very next step.

    notion                                         code
    start a request (its prefix may extend a row)  ProposalStreams.start(rid, request, share_from)
    tokens of a row so far / complete suffix       RowUpdate.ids / RowUpdate.suffix
    what an aborted row generated (to resume)      RowUpdate.partial
    log q_τ, log p0 of a running row's tokens      RowUpdate.logq, RowUpdate.logp0 (early rejection)
    one decode step's events                       one batch of EngineStreams.updates() (StreamBatch.steps)
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from ..runtime_ext.protocol import EngineError, RowEvent, SamplingParams, StreamingEngine
from .suffixes import Suffix, SuffixRequest, suffix_from_meta


@dataclass(frozen=True)
class RowUpdate:
    """Progress of one row: tokens generated so far; the suffix once complete."""

    rid: str
    ids: tuple[int, ...]
    suffix: Suffix | None = None
    aborted: bool = False
    error: BaseException | None = None
    partial: Suffix | None = None
    """An aborted row's tokens with their per-token quantities, when the engine reported them (the embedded
    engine does; a server's abort does not): the request can resume after them instead of starting over."""
    logq: tuple[float, ...] | None = None
    logp0: tuple[float, ...] | None = None
    """log q_τ and log p0 of the tokens so far while the row runs, when the engine reports them (the embedded
    engine does, a server stream does not): what an early rejection bounds the MH ratio with."""


@dataclass
class StreamBatch:
    """What one `updates()` call returns: the row updates and how many engine steps (event batches) they span."""

    updates: list[RowUpdate] = field(default_factory=list)
    steps: int = 0
    """Engine decode steps among them: an abort's or a failure's own report is no step."""


class ProposalStreams(Protocol):
    def start(self, rid: str, request: SuffixRequest, share_from: str | None = None) -> None: ...

    def abort(self, rid: str) -> None: ...

    def updates(self) -> StreamBatch:
        """Block until some row made progress; raise EngineError when nothing is running or it stalls."""
        ...

    def pause(self) -> None:
        """The consumer stops listening for a while (between blocks): never hold the engine meanwhile."""
        ...


def suffix_params(request: SuffixRequest, temperatures: Sequence[float] = ()) -> SamplingParams:
    """The engine parameters of a suffix request (those of the `suffix_proposals` program)."""
    return SamplingParams(max_new_tokens=request.max_tokens, temperature=request.temperature, top_k=-1, top_p=1.0,
                          ignore_eos=True, seed=request.seed, return_logprob=True,
                          logprob_temperatures=tuple(temperatures))


class EngineStreams:
    """`ProposalStreams` on a `protocol.StreamingEngine` (see module docstring)."""

    def __init__(self, engine: Any, *, tempered_temperatures: Sequence[float] = (), require_entropy: bool = False,
                 lockstep: bool = True, stall_timeout_s: float = 600.0, lockstep_timeout_s: float = 5.0) -> None:
        if not isinstance(engine, StreamingEngine):
            raise EngineError(f"{type(engine).__name__} cannot stream rows (no submit_stream): streaming PreSTO needs "
                              "the embedded engine or an SGLang server client")
        self.engine = engine
        self.temperatures = tuple(float(t) for t in tempered_temperatures)
        self.require_entropy = require_entropy
        self.lockstep = lockstep
        self.stall_timeout_s = stall_timeout_s
        self.lockstep_timeout_s = lockstep_timeout_s
        self._cv = threading.Condition()
        self._queue: deque[tuple[list[RowEvent], bool]] = deque()
        """Event batches as the engine posted them, each with whether it reports a decode step."""
        self._posted = self._taken = self._processed = 0
        self._listening = False
        self._requests: dict[str, SuffixRequest] = {}

    def start(self, rid: str, request: SuffixRequest, share_from: str | None = None) -> None:
        with self._cv:
            self._listening = True
            self._requests[rid] = request
        self.engine.submit_stream(list(request.prefix_ids), suffix_params(request, self.temperatures), rid=rid,
                                  listener=self._on_events, share_from=share_from)

    def abort(self, rid: str) -> None:
        self.engine.abort(rid)

    def _on_events(self, events: list[RowEvent]) -> None:
        """Engine side (its worker thread): queue the events; in lockstep wait until the consumer reacted."""
        step = any(not (e.aborted or e.error is not None) for e in events)
        with self._cv:
            self._queue.append((events, step))
            self._posted += 1
            n = self._posted
            self._cv.notify_all()
            if self.lockstep and step and self._listening:
                self._cv.wait_for(lambda: self._processed >= n or not self._listening, timeout=self.lockstep_timeout_s)

    def updates(self) -> StreamBatch:
        with self._cv:
            self._processed = self._taken  # everything handed out before has been acted on
            self._listening = True
            self._cv.notify_all()
            if not self._cv.wait_for(lambda: bool(self._queue), timeout=self.stall_timeout_s):
                raise EngineError(f"streamed rows made no progress for {self.stall_timeout_s} s")
            batches = list(self._queue)
            self._queue.clear()
            self._taken += len(batches)
        out = StreamBatch(steps=sum(step for _, step in batches))  # an abort's own report is no decode step
        for events, _ in batches:
            out.updates.extend(self._update(e) for e in events)
        return out

    def pause(self) -> None:
        with self._cv:
            self._listening = False
            self._processed = self._taken = self._posted
            self._queue.clear()
            self._cv.notify_all()

    def _update(self, e: RowEvent) -> RowUpdate:
        if e.error is not None:
            return RowUpdate(e.rid, e.output_ids, error=e.error)
        if e.aborted:
            req = self._requests.pop(e.rid, None)
            return RowUpdate(e.rid, e.output_ids, aborted=True, partial=self._partial(e, req))
        if not e.finished or e.output is None:
            return RowUpdate(e.rid, e.output_ids, logq=e.output_logq, logp0=e.output_logp0)
        req = self._requests.pop(e.rid, None)
        if req is None:
            return RowUpdate(e.rid, e.output_ids, aborted=True)
        suffix = suffix_from_meta(e.output.meta_info, req, self.temperatures, self.require_entropy)
        return RowUpdate(e.rid, tuple(int(t) for t in suffix.ids), suffix=suffix)

    def _partial(self, e: RowEvent, req: SuffixRequest | None) -> Suffix | None:
        """The tokens an aborted row generated, as a Suffix, when its output carries their quantities."""
        if req is None or e.output is None or not e.output_ids or len(e.output_ids) >= req.max_tokens:
            return None
        try:
            return suffix_from_meta(e.output.meta_info, req, self.temperatures, self.require_entropy,
                                    tokens=len(e.output_ids))
        except EngineError:  # no per-token quantities (a server's abort): the request starts over if needed
            return None


def open_streams(backend: Any, *, tempered_temperatures: Sequence[float] = (),
                 require_entropy: bool = False) -> EngineStreams:
    """The `ProposalStreams` of a frontend backend's engine (embedded engine or SGLang server client)."""
    engine = getattr(backend, "engine", None)
    if engine is None:
        raise EngineError(f"{type(backend).__name__} has no engine to stream rows from")
    lockstep = bool(getattr(engine, "steps_in_lockstep", True))
    return EngineStreams(engine, tempered_temperatures=tempered_temperatures, require_entropy=require_entropy,
                         lockstep=lockstep)
