"""Suffix proposals: the one model call of the power samplers, as an `@sgl.function` program.

A batch of suffix-resampling requests is ONE program that forks one branch per request from an EMPTY root
state (SGLang 0.5.23's `fork()` reads the parent's text before syncing, so nothing is put in the root) and
writes each branch's exact ids with token markers:

    b += token_ids(prompt_ids + response[:cut]); b += sampling_seed(seed)
    b += gen("suffix", max_tokens=T - cut, temperature=τ, ignore_eos=True, return_logprob=True)

and reads ids, log q_τ, log p0 and the entropy of p0 from `b.get_meta_info("suffix")`
(`output_token_logprobs` = [log q_τ, id, text], `output_token_logp0`, `output_token_entropy`).  Only stock
frontend calls and the markers are used, so the program runs unchanged on every token-exact backend
(embedded engine, SGLang server).  The sequential samplers use the same program with one branch; the block
extension x_{L+1:T} ~ q_τ is one such call as well.

    paper                         code
    (x_{0:c}, τ, noise) request   SuffixRequest(prefix_ids, max_tokens, temperature, seed)
    y_{c+1:T}, log q_τ, log p0, H Suffix(ids, logq, logp0, entropy)
    log q_τ' for τ' ∈ 𝒯 (MTM)     Suffix.logq_by_temp[(i, t)]
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np
from scipy.special import logsumexp

from forerun.runtime_ext.protocol import EngineError
from forerun.runtime_ext.sglang_frontend import function, gen
from forerun.runtime_ext.token_markers import sampling_seed, token_ids


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
        if not self.prefix_ids:
            raise ValueError("prefix_ids must be non-empty (it contains the prompt)")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


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

MAX_FULL_VOCAB = 4096
"""Largest vocabulary for which `ProgramProposalModel` asks for p0 over the whole vocabulary (MultiTryMH)."""


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
        branch += gen(
            "suffix",
            max_tokens=req["max_tokens"],
            temperature=req["temperature"],
            top_k=-1,
            top_p=1.0,
            ignore_eos=True,
            return_logprob=True,
            top_logprobs_num=req["top_logprobs_num"] or None,
        )
    out = [(branch.get_meta_info("suffix"), branch.error()) for branch in branches]
    branches.join()
    return out


def _suffix_from_meta(meta: dict[str, Any] | None, req: SuffixRequest, temperatures: tuple[float, ...],
                      vocab_size: int | None) -> Suffix:
    if not meta:
        raise EngineError("suffix proposal returned no meta_info (backend error?)")
    entries = meta.get("output_token_logprobs")
    logp0 = meta.get("output_token_logp0")
    entropy = meta.get("output_token_entropy")
    if entries is None or logp0 is None or entropy is None:
        raise EngineError(
            "the backend must return output_token_logprobs, output_token_logp0 and output_token_entropy "
            f"(got keys {sorted(meta)})"
        )
    if len(entries) != req.max_tokens:
        raise EngineError(
            f"suffix has {len(entries)} tokens, expected {req.max_tokens} (a stop string or EOS ended it early; "
            "power samplers need fixed-length responses)"
        )
    ids = np.asarray([int(e[1]) for e in entries], dtype=np.int64)
    logq = np.asarray([float(e[0]) for e in entries], dtype=np.float64)
    p0 = np.asarray(logp0, dtype=np.float64)
    ent = np.asarray(entropy, dtype=np.float64)
    by_temp = None
    if temperatures:
        tops = meta.get("output_top_logprobs")
        if tops is None or len(tops) != len(ids):
            raise EngineError("MultiTryMH needs output_top_logprobs over the full vocabulary for every token")
        rows = np.empty((len(temperatures), len(ids)))
        for t, top in enumerate(tops):
            if vocab_size is None or len(top) < vocab_size:
                raise EngineError(
                    f"MultiTryMH needs p0 over the full vocabulary ({vocab_size}) to get log q_τ' at every τ'; "
                    f"the backend returned {len(top)} entries"
                )
            full = np.asarray([float(e[0]) for e in top], dtype=np.float64)
            for i, temp in enumerate(temperatures):
                rows[i, t] = p0[t] / temp - float(logsumexp(full / temp))
        by_temp = rows
    if not (np.all(np.isfinite(logq)) and np.all(np.isfinite(p0)) and np.all(np.isfinite(ent))):
        raise EngineError("suffix proposal returned non-finite log-probabilities")
    return Suffix(ids=ids, logq=logq, logp0=p0, entropy=ent, logq_by_temp=by_temp)


class ProgramProposalModel:
    """`ProposalModel` that runs `suffix_proposals` on an SGLang frontend backend (one program per call).

    `tempered_temperatures` (MultiTryMH) asks for p0 over the whole vocabulary (`top_logprobs_num` =
    vocab size) and derives log q_τ'(y_t) = log p0(y_t)/τ' − log Σ_u p0(u)^{1/τ'} exactly; backends that
    cannot return the whole vocabulary make MultiTryMH fail with a clear error.
    """

    def __init__(self, backend: Any, *, tempered_temperatures: Sequence[float] = (),
                 vocab_size: int | None = None) -> None:
        self.backend = backend
        self.tempered_temperatures = tuple(float(t) for t in tempered_temperatures)
        self.vocab_size = vocab_size
        if self.tempered_temperatures and not vocab_size:
            raise ValueError("tempered_temperatures needs vocab_size")
        if self.tempered_temperatures and vocab_size > MAX_FULL_VOCAB:
            raise ValueError(
                f"MultiTryMH needs log q_τ' of every token at every candidate temperature {self.tempered_temperatures}; "
                f"the engine returns log q only at the sampled τ, so forerun derives the others from p0 over the full "
                f"vocabulary, which is practical only up to {MAX_FULL_VOCAB} tokens (this model has {vocab_size}). "
                "An engine that returns per-token log q at extra temperatures is needed for larger models."
            )
        self.last_wall_time = math.nan

    def generate(self, requests: Sequence[SuffixRequest]) -> list[Suffix]:
        if not requests:
            raise ValueError("a model call needs at least one request")
        args = [
            {"prefix_ids": list(r.prefix_ids), "max_tokens": r.max_tokens, "temperature": r.temperature,
             "seed": r.seed, "top_logprobs_num": self.vocab_size if self.tempered_temperatures else 0,
             "nonce": next(_NONCES)}
            for r in requests
        ]
        start = time.perf_counter()
        state = suffix_proposals.run(requests=args, backend=self.backend)
        results = state.ret_value
        self.last_wall_time = time.perf_counter() - start
        errors = [e for _, e in results if e is not None] + ([state.error()] if state.error() is not None else [])
        if errors:
            raise EngineError(f"suffix proposal program failed: {errors[0]!r}")
        return [_suffix_from_meta(m, r, self.tempered_temperatures, self.vocab_size)
                for (m, _), r in zip(results, requests)]


class LogitTableModel:
    """An engine-free toy "LLM" (numpy, float64) for tests and the brute-force oracle.

    Next-token logits depend on the previous token and the absolute position:
    `logits = table[prev] + position_bias[pos % period]`.  Sampling follows the engine contract: Gumbel-max
    over the full vocabulary with noise keyed by (seed, absolute position), so a suffix depends only on its
    prefix ids and seed.  It returns log q_τ, log p0, entropy of p0 and (if asked) log q_τ' per token.
    """

    def __init__(self, vocab_size: int = 4, *, seed: int = 0, scale: float = 2.0, period: int = 3,
                 tempered_temperatures: Sequence[float] = ()) -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([seed, 7])))
        self.vocab_size = vocab_size
        self.table = scale * rng.standard_normal((vocab_size, vocab_size))
        self.position_bias = scale * 0.5 * rng.standard_normal((period, vocab_size))
        self.tempered_temperatures = tuple(float(t) for t in tempered_temperatures)
        self.calls: list[list[SuffixRequest]] = []
        self._tables: dict[float, np.ndarray] = {}

    def logits(self, prev: int, position: int) -> np.ndarray:
        return self.table[prev] + self.position_bias[position % len(self.position_bias)]

    def _table(self, temperature: float) -> np.ndarray:
        """log q_τ for every (prev, phase): shape (V, period, V); τ = 1 is log p0."""
        if temperature not in self._tables:
            z = (self.table[:, None, :] + self.position_bias[None, :, :]) / temperature
            self._tables[temperature] = z - logsumexp(z, axis=-1, keepdims=True)
        return self._tables[temperature]

    def log_p0(self, prev: int, position: int) -> np.ndarray:
        return self._table(1.0)[prev, position % len(self.position_bias)]

    def log_q(self, prev: int, position: int, temperature: float) -> np.ndarray:
        return self._table(float(temperature))[prev, position % len(self.position_bias)]

    def gumbel(self, seed: int, position: int) -> np.ndarray:
        """Per-token Gumbel noise keyed by (seed, absolute position), independent of the batch."""
        bits = np.random.SeedSequence([int(seed), int(position)]).generate_state(self.vocab_size, dtype=np.uint64)
        u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
        return -np.log(-np.log(u))

    def sequence_logp0(self, prefix_ids: Sequence[int], continuation: Sequence[int]) -> float:
        """log p0(continuation | prefix)."""
        ids = list(prefix_ids)
        total = 0.0
        for tok in continuation:
            total += float(self.log_p0(ids[-1], len(ids))[tok])
            ids.append(int(tok))
        return total

    def sequence_logq(self, prefix_ids: Sequence[int], continuation: Sequence[int], temperature: float) -> float:
        """log q_τ(continuation | prefix)."""
        ids = list(prefix_ids)
        total = 0.0
        for tok in continuation:
            total += float(self.log_q(ids[-1], len(ids), temperature)[tok])
            ids.append(int(tok))
        return total

    def _one(self, req: SuffixRequest) -> Suffix:
        ids = list(req.prefix_ids)
        if max(ids) >= self.vocab_size or min(ids) < 0:
            raise ValueError(f"token id out of the toy vocabulary [0, {self.vocab_size})")
        period = len(self.position_bias)
        p0_table, q_table = self._table(1.0), self._table(float(req.temperature))
        extra = [self._table(t) for t in self.tempered_temperatures]
        n = req.max_tokens
        out = np.empty(n, dtype=np.int64)
        lq, lp, ent = np.empty(n), np.empty(n), np.empty(n)
        by_temp = np.empty((len(extra), n))
        prev = ids[-1]
        for i in range(n):
            pos = len(ids) + i
            phase = pos % period
            logq = q_table[prev, phase]
            tok = int(np.argmax(logq + self.gumbel(req.seed, pos)))
            logp0 = p0_table[prev, phase]
            out[i], lq[i], lp[i] = tok, logq[tok], logp0[tok]
            ent[i] = -float(np.dot(np.exp(logp0), logp0))
            for k, tab in enumerate(extra):
                by_temp[k, i] = tab[prev, phase, tok]
            prev = tok
        return Suffix(ids=out, logq=lq, logp0=lp, entropy=ent, logq_by_temp=by_temp if extra else None)

    def generate(self, requests: Sequence[SuffixRequest]) -> list[Suffix]:
        if not requests:
            raise ValueError("a model call needs at least one request")
        self.calls.append(list(requests))
        return [self._one(r) for r in requests]
