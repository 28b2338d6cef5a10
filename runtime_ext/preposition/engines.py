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

from typing import Any, Callable, Protocol, Sequence, runtime_checkable

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


def kv_headroom(engine: Any) -> Callable[[], int]:
    """B from an engine's `stats()`: KV-pool tokens not held by live state (pinned/locked prefixes and
    running requests), i.e. what a pre-position may use without evicting live state (Algorithm 1 line 2).

    Reads the embedded engine's `kv_headroom_tokens` (max_total_tokens - locked - reserved), else the keys
    `radix_max_total_tokens`, `radix_locked_tokens`, `active_kv_tokens`.
    """
    stats = getattr(engine, "stats", None)
    if stats is None:
        raise ValueError("kv_headroom needs an engine with stats()")

    def headroom() -> int:
        st = stats()
        if "kv_headroom_tokens" in st:  # the engine's own count: budget - locked - reserved, each token once
            return int(st["kv_headroom_tokens"])
        missing = [k for k in ("radix_max_total_tokens", "radix_locked_tokens", "active_kv_tokens") if k not in st]
        if missing:
            raise KeyError(f"engine stats() lacks {missing}")
        return int(st["radix_max_total_tokens"]) - int(st["radix_locked_tokens"]) - int(st["active_kv_tokens"])

    return headroom


def turn_stop_ids(engine: Any, tokenizer: Any) -> frozenset[int]:
    """The tokens that end a greedy answer: the engine's EOS set (the embedded engine's `model_info.eos_token_ids`)
    and the tokenizer's EOS, whichever are known."""
    ids = set(getattr(getattr(engine, "model_info", None), "eos_token_ids", None) or ())
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    return frozenset(int(t) for t in ids)


def context_limit(engine: Any) -> int | None:
    """The engine's context window in tokens (the embedded engine's `model_info.max_context`), if known."""
    limit = getattr(getattr(engine, "model_info", None), "max_context", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else None
