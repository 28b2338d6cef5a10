"""An engine-free toy "LLM" for tests and the brute-force oracle of the samplers (a test double)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.special import logsumexp

from ..programs.suffixes import Suffix, SuffixRequest


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
