"""What a power sampler asks of a model call and what it gets back: suffix requests and generated suffixes.

The shared vocabulary of the two proposal paths - one batched program per call (`proposals`) and one streamed
row per request (`stream_proposals`) - and the one reader of an engine's meta_info into a `Suffix`.

    paper                         code
    (x_{0:c}, τ, noise) request   SuffixRequest(prefix_ids, max_tokens, temperature, seed)
    y_{c+1:T}, log q_τ, log p0, H Suffix(ids, logq, logp0, entropy)
    log q_τ' for τ' ∈ 𝒯 (MTM)     Suffix.logq_by_temp[i, t]  (meta_info output_token_logq_by_temperature)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Sequence

import numpy as np

from ..runtime_ext.protocol import EngineError


def check_generation_request(prefix_ids: Sequence[int], max_tokens: int, seed: int) -> None:
    """The checks every generation request of a program shares (suffix proposals, completions)."""
    if not prefix_ids:
        raise ValueError("prefix_ids must be non-empty (it contains the prompt)")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")


@dataclass(frozen=True)
class GenerationRequest:
    """Generate up to `max_tokens` tokens after `prefix_ids` from q_τ with per-token noise keyed by `seed`."""

    prefix_ids: tuple[int, ...]
    """Prompt ids followed by the kept response prefix x_{1:c}."""
    max_tokens: int
    """T − c for a suffix (fixed length: EOS ignored); the most tokens for a completion (stops at EOS)."""
    temperature: float
    """τ of q_τ."""
    seed: int
    """Sampling seed (the engine keys per-token noise by (seed, absolute position))."""

    greedy_allowed: ClassVar[bool] = False
    """Whether τ = 0 (greedy) is a valid temperature of this kind of request."""

    def __post_init__(self) -> None:
        check_generation_request(self.prefix_ids, self.max_tokens, self.seed)
        if not (self.temperature >= 0 if self.greedy_allowed else self.temperature > 0):
            raise ValueError(f"temperature must be {'>=' if self.greedy_allowed else '>'} 0, got {self.temperature}")


@dataclass(frozen=True)
class SuffixRequest(GenerationRequest):
    """One suffix-resampling request of a power sampler: exactly `max_tokens` tokens (EOS ignored), τ > 0."""


@dataclass(frozen=True)
class Suffix:
    """A generated suffix with per-token log q_τ, log p0, entropy of p0 (and log q at other temperatures)."""

    ids: np.ndarray
    logq: np.ndarray
    logp0: np.ndarray
    entropy: np.ndarray
    logq_by_temp: np.ndarray | None = None
    """(|𝒯|, len) token log q_τ' for the temperatures the model was asked for (MultiTryMH), else None."""

    def __post_init__(self) -> None:
        n = len(self.ids)
        for name in ("logq", "logp0", "entropy"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Suffix.{name} has length {len(getattr(self, name))}, expected {n}")
        if self.logq_by_temp is not None and self.logq_by_temp.shape[1] != n:
            raise ValueError(f"Suffix.logq_by_temp has shape {self.logq_by_temp.shape}, expected (*, {n})")

    def head(self, n: int) -> "Suffix":
        """The first n tokens with their per-token quantities."""
        by_temp = None if self.logq_by_temp is None else self.logq_by_temp[:, :n]
        return Suffix(ids=self.ids[:n], logq=self.logq[:n], logp0=self.logp0[:n], entropy=self.entropy[:n],
                      logq_by_temp=by_temp)

    def then(self, rest: "Suffix") -> "Suffix":
        """These tokens followed by `rest` (a request resumed after its first len(self) tokens)."""
        if (self.logq_by_temp is None) != (rest.logq_by_temp is None):
            raise ValueError("Suffix.then: both parts need log q at the same temperatures, or neither")
        by_temp = None if self.logq_by_temp is None else np.concatenate([self.logq_by_temp, rest.logq_by_temp], axis=1)
        cat = lambda name: np.concatenate([getattr(self, name), getattr(rest, name)])
        return Suffix(ids=cat("ids"), logq=cat("logq"), logp0=cat("logp0"), entropy=cat("entropy"), logq_by_temp=by_temp)


class ProposalModel(Protocol):
    """One model call: generate every request of a batch; return the suffixes in order."""

    def generate(self, requests: Sequence[SuffixRequest]) -> list[Suffix]: ...


def suffix_from_meta(meta: dict[str, Any] | None, req: SuffixRequest, temperatures: tuple[float, ...],
                      require_entropy: bool = True, tokens: int | None = None) -> Suffix:
    """The suffix in a response's meta_info: `tokens` of them (default: all req.max_tokens; fewer for the part an
    aborted row generated)."""
    expected = req.max_tokens if tokens is None else tokens
    if not meta:
        raise EngineError("suffix proposal returned no meta_info (backend error?)")
    entries = meta.get("output_token_logprobs")
    logp0 = meta.get("output_token_logp0")
    entropy = meta.get("output_token_entropy")
    if entries is None or logp0 is None:
        raise EngineError(
            "the backend must return output_token_logprobs and output_token_logp0 "
            f"(got keys {sorted(meta)})"
        )
    if entropy is None and require_entropy:
        raise EngineError(
            "this sampler (EntropyCut) needs the entropy of p0 of every generated token (meta_info "
            "'output_token_entropy'); the backend did not return it. A stock SGLang server does not report it: "
            "launch the server with scripts/launch_runtime --plugin (forerun's sampler plugin), or use the embedded engine."
        )
    if len(entries) != expected:
        raise EngineError(
            f"suffix has {len(entries)} tokens, expected {expected} (a stop string or EOS ended it early; "
            "power samplers need fixed-length responses)"
        )
    ids = np.asarray([int(e[1]) for e in entries], dtype=np.int64)
    logq = np.asarray([float(e[0]) for e in entries], dtype=np.float64)
    p0 = np.asarray(logp0, dtype=np.float64)
    ent = np.asarray(entropy, dtype=np.float64) if entropy is not None else np.full(len(ids), np.nan)
    by_temp = None
    if temperatures:
        rows = meta.get("output_token_logq_by_temperature")
        got = meta.get("logprob_temperatures")
        if rows is None:
            raise EngineError(
                f"MultiTryMH needs log q_τ' of every generated token at τ' ∈ {list(temperatures)} (meta_info "
                "'output_token_logq_by_temperature'); the backend did not return it"
            )
        if got is not None and [float(t) for t in got] != list(temperatures):
            raise EngineError(f"asked for log q at temperatures {list(temperatures)}, the backend returned {got}")
        by_temp = np.asarray(rows, dtype=np.float64)
        if by_temp.shape != (len(temperatures), len(ids)):
            raise EngineError(
                f"output_token_logq_by_temperature has shape {by_temp.shape}, expected "
                f"({len(temperatures)}, {len(ids)}) (temperatures × generated tokens)"
            )
        if not np.all(np.isfinite(by_temp)):
            raise EngineError("suffix proposal returned non-finite log q at the MultiTryMH temperatures")
    if not (np.all(np.isfinite(logq)) and np.all(np.isfinite(p0))
            and (entropy is None or np.all(np.isfinite(ent)))):
        raise EngineError("suffix proposal returned non-finite log-probabilities")
    return Suffix(ids=ids, logq=logq, logp0=p0, entropy=ent, logq_by_temp=by_temp)
