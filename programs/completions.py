"""Completions that stop at EOS, as one `@sgl.function` program per model call (the decoding baselines and
Power-SMC; the MH samplers use the fixed-length `proposals.suffix_proposals` instead).

A batch of completion requests is ONE program forking one token-exact, seeded branch per request:

    b += token_ids(prompt_ids + response_so_far); b += sampling_seed(seed)
    b += gen("completion", max_tokens=m, temperature=τ, ignore_eos=False, return_logprob=True)

so the branches of one call share the engine's batched decode (the embedded engine's continuous batching,
or a server's).  A branch stops at the model's EOS (kept as its last id, `finished=True`) or after
`max_tokens` tokens - not at the backend's chat-template stop strings, which SGLang's interpreter would add to the
gen (the program runs on `proposals.without_template_stops(backend)`).  Temperature 0 is greedy decoding.

    paper / notion                          code
    y_{t+1:t+m} ~ q_τ(· | x, y_{1:t})       CompletionRequest(prefix_ids, max_tokens=m, temperature=τ, seed)
    log q_τ, log p0, H(p0) per token        Completion.logq, .logp0, .entropy (NaN when not reported)
    stopped at EOS                          Completion.finished
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, Sequence

import numpy as np

from ..runtime_ext.backends.sglang_frontend import function, gen
from ..runtime_ext.backends.token_markers import sampling_seed, token_ids
from ..runtime_ext.protocol import EngineError
from .proposals import without_template_stops
from .suffixes import GenerationRequest


@dataclass(frozen=True)
class CompletionRequest(GenerationRequest):
    """Generate up to `max_tokens` tokens after `prefix_ids` from q_τ (τ = 0: greedy), stopping at EOS."""

    greedy_allowed: ClassVar[bool] = True


@dataclass(frozen=True)
class Completion:
    """A generated continuation with per-token log q_τ, log p0 and entropy of p0."""

    ids: np.ndarray
    logq: np.ndarray
    logp0: np.ndarray
    entropy: np.ndarray
    finished: bool
    """True when the continuation ended with an EOS token (its last id)."""


class CompletionModel(Protocol):
    """One model call: complete every request of a batch; return the completions in order."""

    def complete(self, requests: Sequence[CompletionRequest]) -> list[Completion]: ...


_NONCES = itertools.count(1)


@function
def completion_program(s, requests):
    """Fork one seeded, token-exact branch per request from an empty root (see `proposals`)."""
    branches = s.fork(len(requests))
    for branch, req in zip(branches, requests):
        branch += sampling_seed(req["nonce"])  # unique program text per request (see proposals.py)
        branch += token_ids(req["prefix_ids"])
        branch += sampling_seed(req["seed"])
        branch += gen("completion", max_tokens=req["max_tokens"], temperature=req["temperature"], top_k=-1,
                      top_p=1.0, ignore_eos=False, return_logprob=True)
    out = [(branch.get_meta_info("completion"), branch.error()) for branch in branches]
    branches.join()
    return out


def completion_from_meta(meta: dict[str, Any] | None) -> Completion:
    """A `Completion` from a gen's SGLang-shaped meta_info."""
    if not meta or meta.get("output_token_logprobs") is None:
        raise EngineError("completion returned no output_token_logprobs (backend error?)")
    entries = meta["output_token_logprobs"]
    n = len(entries)
    logp0 = meta.get("output_token_logp0")
    if logp0 is None or len(logp0) != n:
        raise EngineError("the backend must return output_token_logp0 for every generated token")
    entropy = meta.get("output_token_entropy")
    reason = meta.get("finish_reason") or {}
    return Completion(
        ids=np.asarray([int(e[1]) for e in entries], dtype=np.int64),
        logq=np.asarray([float(e[0]) for e in entries], dtype=np.float64),
        logp0=np.asarray(logp0, dtype=np.float64),
        entropy=np.asarray(entropy if entropy is not None and len(entropy) == n else [math.nan] * n),
        finished=isinstance(reason, dict) and reason.get("type") == "stop",
    )


class ProgramCompletionModel:
    """`CompletionModel` that runs `completion_program` on an SGLang frontend backend (one program a call)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def complete(self, requests: Sequence[CompletionRequest]) -> list[Completion]:
        if not requests:
            raise ValueError("a model call needs at least one request")
        args = [{"prefix_ids": list(r.prefix_ids), "max_tokens": r.max_tokens, "temperature": r.temperature,
                 "seed": r.seed, "nonce": next(_NONCES)} for r in requests]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Error in stream_executor")
            # without the chat template's stop strings: a raw completion ends at EOS or max_tokens only, never at
            # a template marker ("<|im_end|>") that is no EOS of the model
            state = completion_program.run(requests=args, backend=without_template_stops(self.backend))
        results = state.ret_value
        errors = [e for _, e in results if e is not None] + ([state.error()] if state.error() is not None else [])
        if errors:
            err = errors[0]
            raise err if isinstance(err, EngineError) else EngineError(f"completion program failed: {err!r}")
        return [completion_from_meta(m) for m, _ in results]


@dataclass
class DecodeResult:
    """A finished decoding-baseline or Power-SMC run on one prompt."""

    method: str
    prompt_id: str
    response: Completion
    call_times: list[float] = field(default_factory=list)
    """Wall time of every model call (one batched call per block / per sample set)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Method-specific diagnostics (resamples, ESS per block, the candidates' scores, ...)."""
    tokens_decoded: int = 0
    """Every token the method decoded for this answer (all N samples, all particles): its compute budget."""

    @property
    def response_ids(self) -> tuple[int, ...]:
        return tuple(int(t) for t in self.response.ids)

    @property
    def call_time(self) -> float:
        return float(sum(self.call_times))

    @property
    def num_calls(self) -> int:
        return len(self.call_times)

    @property
    def log_likelihood(self) -> float:
        """Eq. 21 over the generated tokens: mean log p0."""
        return float(np.mean(self.response.logp0)) if len(self.response.ids) else math.nan

    @property
    def confidence(self) -> float:
        """Eq. 22: mean negative entropy of p0 (NaN when the backend reports no entropy)."""
        return float(-np.mean(self.response.entropy)) if len(self.response.ids) else math.nan
