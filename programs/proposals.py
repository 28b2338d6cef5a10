"""Suffix proposals: the one model call of the power samplers, as an `@sgl.function` program.

A batch of suffix-resampling requests is ONE program that forks one branch per request from an EMPTY root
state (SGLang 0.5.23's `fork()` reads the parent's text before syncing, so nothing is put in the root) and
writes each branch's exact ids with token markers:

    b += token_ids(prompt_ids + response[:cut]); b += sampling_seed(seed)
    b += gen("suffix", max_tokens=T - cut, temperature=τ, ignore_eos=True, return_logprob=True)

and reads ids, log q_τ, log p0 and the entropy of p0 from `b.get_meta_info("suffix")`
(`output_token_logprobs` = [log q_τ, id, text], `output_token_logp0`, `output_token_entropy`).  MultiTryMH
also writes `logprob_temperatures(𝒯)` into each branch and reads `output_token_logq_by_temperature`
(log q_τ'(y_t | ·) over the full vocabulary, one row per τ' ∈ 𝒯) from the same meta_info.  Only stock
frontend calls and the markers are used, so the program runs unchanged on every token-exact backend
(embedded engine, SGLang server).  The sequential samplers use the same program with one branch; the block
extension x_{L+1:T} ~ q_τ is one such call as well.

    paper                         code
    (x_{0:c}, τ, noise) request   SuffixRequest(prefix_ids, max_tokens, temperature, seed)
    y_{c+1:T}, log q_τ, log p0, H Suffix(ids, logq, logp0, entropy)
    log q_τ' for τ' ∈ 𝒯 (MTM)     Suffix.logq_by_temp[i, t]  (meta_info output_token_logq_by_temperature)
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from ..runtime_ext.protocol import EngineError
from ..runtime_ext.backends.sglang_frontend import function, gen
from ..runtime_ext.backends.token_markers import logprob_temperatures, sampling_seed, token_ids


def check_generation_request(prefix_ids: Sequence[int], max_tokens: int, seed: int) -> None:
    """The checks every generation request of a program shares (suffix proposals, completions)."""
    if not prefix_ids:
        raise ValueError("prefix_ids must be non-empty (it contains the prompt)")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")


@dataclass(frozen=True)
class SuffixRequest:
    """One suffix-resampling request: generate `max_tokens` tokens after `prefix_ids` from q_τ."""

    prefix_ids: tuple[int, ...]
    """Prompt ids followed by the kept response prefix x_{1:c}."""
    max_tokens: int
    """T − c (fixed length: EOS ignored)."""
    temperature: float
    """τ of q_τ."""
    seed: int
    """Sampling seed (the engine keys per-token noise by (seed, absolute position))."""

    def __post_init__(self) -> None:
        check_generation_request(self.prefix_ids, self.max_tokens, self.seed)
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


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


_NONCES = itertools.count(1)


class ProposalModel(Protocol):
    """One model call: generate every request of a batch; return the suffixes in order."""

    def generate(self, requests: Sequence[SuffixRequest]) -> list[Suffix]: ...


@function
def suffix_proposals(s, requests):
    """Fork one branch per request from an empty root; each branch is token-exact and seeded."""
    branches = s.fork(len(requests))
    for branch, req in zip(branches, requests):
        # A unique seed marker first (the last seed marker wins): no two requests share their program text,
        # so a backend that remembers generated text by program text can never substitute an earlier
        # request's ids (which would happen for a repeated request whose output decoded to "").
        branch += sampling_seed(req["nonce"])
        branch += token_ids(req["prefix_ids"])
        branch += sampling_seed(req["seed"])
        if req["logprob_temperatures"]:
            branch += logprob_temperatures(req["logprob_temperatures"])
        branch += gen(
            "suffix",
            max_tokens=req["max_tokens"],
            temperature=req["temperature"],
            top_k=-1,
            top_p=1.0,
            ignore_eos=True,
            return_logprob=True,
        )
    out = [(branch.get_meta_info("suffix"), branch.error()) for branch in branches]
    branches.join()
    return out


def _suffix_from_meta(meta: dict[str, Any] | None, req: SuffixRequest, temperatures: tuple[float, ...],
                      require_entropy: bool = True) -> Suffix:
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
    if len(entries) != req.max_tokens:
        raise EngineError(
            f"suffix has {len(entries)} tokens, expected {req.max_tokens} (a stop string or EOS ended it early; "
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


class ProgramProposalModel:
    """`ProposalModel` that runs `suffix_proposals` on an SGLang frontend backend (one program per call).

    `tempered_temperatures` 𝒯 (MultiTryMH): every branch carries a `logprob_temperatures(𝒯)` marker and the
    engine returns log q_τ'(y_t | ·) over the full vocabulary for each τ' ∈ 𝒯 (embedded engine, or an SGLang
    server with forerun's plugin; a stock server refuses such requests with a clear error).  `require_entropy` (default False; EntropyCut callers
    pass True): a backend that does not report the entropy of p0 is then an error; otherwise the entropy is
    NaN (PowerMH and MultiTryMH do not use it), so PowerMH runs on a stock SGLang server.
    """

    def __init__(self, backend: Any, *, tempered_temperatures: Sequence[float] = (),
                 require_entropy: bool = False) -> None:
        self.backend = backend
        self.tempered_temperatures = tuple(float(t) for t in tempered_temperatures)
        if any(not t > 0 for t in self.tempered_temperatures):
            raise ValueError(f"tempered_temperatures must be > 0, got {self.tempered_temperatures}")
        self.require_entropy = bool(require_entropy)
        self.last_wall_time = math.nan

    def streams(self) -> Any:
        """The rows of streaming PreSTO on this backend's engine (`stream_proposals.EngineStreams`)."""
        from .stream_proposals import open_streams  # it reads suffixes with this module's helpers

        return open_streams(self.backend, tempered_temperatures=self.tempered_temperatures,
                            require_entropy=self.require_entropy)

    def generate(self, requests: Sequence[SuffixRequest]) -> list[Suffix]:
        if not requests:
            raise ValueError("a model call needs at least one request")
        args = [
            {"prefix_ids": list(r.prefix_ids), "max_tokens": r.max_tokens, "temperature": r.temperature,
             "seed": r.seed, "logprob_temperatures": list(self.tempered_temperatures), "nonce": next(_NONCES)}
            for r in requests
        ]
        start = time.perf_counter()
        with warnings.catch_warnings():
            # SGLang's interpreter warns with a traceback when a branch fails; the error is re-raised below
            warnings.filterwarnings("ignore", message="Error in stream_executor")
            state = suffix_proposals.run(requests=args, backend=self.backend)
        results = state.ret_value
        self.last_wall_time = time.perf_counter() - start
        errors = [e for _, e in results if e is not None] + ([state.error()] if state.error() is not None else [])
        if errors:
            err = errors[0]
            if isinstance(err, EngineError):
                raise err
            raise EngineError(f"suffix proposal program failed: {err!r}")
        return [_suffix_from_meta(m, r, self.tempered_temperatures, self.require_entropy)
                for (m, _), r in zip(results, requests)]
