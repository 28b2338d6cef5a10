"""The one engine interface of pre-positioning, and its adapter for forerun engines.

The prepositioner asks an engine for two things, each at an explicit request priority: the ready
distribution at a decision point (Algorithm 1: one forward pass over state ‖ E, read as the top-2 of p0 at
the last position), and an ordinary greedy generation (Algorithm 2's fall-through, and a session's tail).

    engine                                   adapter
    embedded engine, SGLangServerClient      EngineAdapter (both are forerun `Engine`s with a priority)
    token-exact SGLang frontend backend      programs.sessions.ProgramEngine (the @sgl.function programs
                                             `decision_point` and `session_turn`)

    paper                                    code
    ready distribution at p = n_s + L_entry  PrepositionEngine.ready_distribution(state ‖ E, priority=−1)
    (Eq. 1), as its top-2 log-probs          -> [[logprob, token_id, text], ...] best first
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from ..protocol import GenerateOutput, SamplingParams

TopLogprobs = list[list[Any]]
"""SGLang's `output_top_logprobs[0]`: [[logprob, token_id, text], ...] at one position, best first."""


@runtime_checkable
class PrepositionEngine(Protocol):
    """What pre-positioning needs from an engine."""

    def ready_distribution(self, input_ids: Sequence[int], *, priority: int) -> TopLogprobs:
        """The top-2 (at least) log-probs of p0 at the decision point, the last position of `input_ids`."""
        ...

    def generate(self, input_ids: Sequence[int], params: SamplingParams, *, priority: int) -> GenerateOutput:
        """One greedy request (temperature 0) run to completion."""
        ...


def ready_request_params() -> SamplingParams:
    """The decision-point request: one temperature-0 token with the top-2 of p0 (server-compatible)."""
    return SamplingParams(max_new_tokens=1, temperature=0.0, return_logprob=True, top_logprobs_num=2)


def top_logprobs_at_decision_point(out: GenerateOutput) -> TopLogprobs:
    """`output_top_logprobs[0]` of a decision-point request, or ValueError when the engine returned none."""
    top = out.meta_info.get("output_top_logprobs")
    if not top or not top[0]:
        raise ValueError("engine returned no output_top_logprobs for the decision point (top_logprobs_num=2)")
    return list(top[0])


class EngineAdapter:
    """`PrepositionEngine` over a forerun engine: anything with `generate(ids, params, *, priority)` (the
    embedded engine, `SGLangServerClient`, test doubles).  Both requests carry their priority."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def ready_distribution(self, input_ids: Sequence[int], *, priority: int) -> TopLogprobs:
        out = self.engine.generate(list(input_ids), ready_request_params(), priority=priority)
        return top_logprobs_at_decision_point(out)

    def generate(self, input_ids: Sequence[int], params: SamplingParams, *, priority: int) -> GenerateOutput:
        return self.engine.generate(list(input_ids), params, priority=priority)


def as_preposition_engine(engine: Any) -> PrepositionEngine:
    """`engine` itself when it implements `PrepositionEngine`, else `EngineAdapter(engine)`.

    A frontend backend is not an engine: wrap it in `programs.sessions.ProgramEngine` (its requests then
    run through the @sgl.function programs) or pass its `.engine`.
    """
    if isinstance(engine, PrepositionEngine):
        return engine
    from ..backends.sglang_frontend import BaseBackend

    if isinstance(engine, BaseBackend):
        raise TypeError(f"{type(engine).__name__} is an SGLang frontend backend, not an engine: pass "
                        "ProgramEngine(backend) (the @sgl.function programs) or backend.engine")
    return EngineAdapter(engine)
