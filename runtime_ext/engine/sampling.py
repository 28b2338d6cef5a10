"""Per-token sampling math of the embedded engine: pure functions over logits (no engine state).

    paper / notion                        code
    u(seed, p), the sampling noise        sampling_uniform(seed, position)
    m, S = Σ_v exp(l_v - m)               VocabStats.max, .log_s   (vocab_stats(logits))
    log p0(y | y_<t) = l_y - m - log S    VocabStats.logp0(row, y)
    H(p0(· | y_<t))                       VocabStats.entropy
    T_τ = Σ_v exp((l_v - m) / τ)          log_totals(stats, rows, τs)
    log q_τ(y) = (l_y - m) / τ - log T_τ  VocabStats.logq(row, y, τ, log T_τ)
    y_t ~ q_τ (inverse CDF, one u)        draw_tokens(stats, requests)  (sample_inverse_cdf when filtered)
    log q_τ(· | y_<t) with top-k / top-p  sampling_log_probs(logits, τ, top_k, top_p, min_p)
      / min-p
    q_τ restricted to allowed tokens A    restricted_stats(stats, rows, allowed): the rows' logits with -inf
                                          outside A, drawn by the same draw_tokens (constrained decoding)

q_τ is the full-vocabulary distribution softmax(logits / τ) restricted by top-k / top-p when (and only
when) the request asks for it; τ = 0 is argmax, whose reported log q is log p0(y), as SGLang reports it (it runs
τ < 1e-6 as τ = 1 with top_k = 1 and returns log_softmax of the logits: sampler.py's greedy branch).  The token is
drawn by
inverse-CDF sampling (token-id order) with ONE uniform u from a counter-based stream keyed by
(seed, absolute position) - so the drawn tokens never depend on batch composition or scheduling.

Precision.  With the native kernels the vocabulary sums run in the logits' dtype: for float32 logits,
exp(l - m) in float32, blocks of 16 summed by a fixed tree, blocks accumulated in double (measured against
float64 log-softmax of the same logits on SmolLM2: see BENCHMARKS.md; errors ~1e-7 nats per token, far
below the float32 logits' own rounding).  Every row is computed alone, so the results are batch-invariant;
at τ = 1 without top-k / top-p, log q is log p0 bit for bit.  Without the kernels (no compiler) the same
quantities are computed with torch in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from ..protocol import SamplingParams

_MASK64 = (1 << 64) - 1
_M32 = 0xFFFFFFFF
_POOL_PAIRS = [(src, dst) for src in range(4) for dst in range(4) if src != dst]


def _seed_sequence_words(entropy: Sequence[int]) -> tuple[int, int]:
    """The first two uint32 words of numpy's `SeedSequence(entropy).generate_state(2, np.uint32)` (pool of 4
    words, no spawn key): O'Neill's seed_seq hash as numpy defines it, in Python integers (all mod 2^32):
    hashmix(v) = (v ^ h) * h' with h' = h * MULT_A, then v ^= v >> 16; mix(x, y) = L x - R y, then ^= >> 16.
    The same words as numpy's (tested against it), 8 µs against numpy's 20 warm: once per row and step, numpy's
    path took 0.35 ms of a one-row decode step (its code cold after the step streamed the weights; 2026-12-04)."""
    words: list[int] = []
    for n in entropy:
        if n < 0:
            raise ValueError("seed words must be non-negative")
        words.append(n & _M32)
        while n > _M32:
            n >>= 32
            words.append(n & _M32)
    words += [0] * (4 - len(words))
    h = 0x43B0D7E5
    pool = []
    for v in words[:4]:
        h, v = h * 0x931E8875 & _M32, v ^ h
        v = v * h & _M32
        pool.append(v ^ v >> 16)
    pairs = _POOL_PAIRS + [(src, dst) for src in range(4, len(words)) for dst in range(4)]
    for src, dst in pairs:
        v = pool[src] if src < 4 else words[src]
        h, v = h * 0x931E8875 & _M32, v ^ h
        v = v * h & _M32
        r = 0xCA01F9DD * pool[dst] - 0x4973F715 * (v ^ v >> 16) & _M32
        pool[dst] = r ^ r >> 16
    g, out = 0x8B51F9DD, []
    for v in pool[:2]:
        g, v = g * 0x58F38DED & _M32, v ^ g
        v = v * g & _M32
        out.append(v ^ v >> 16)
    return out[0], out[1]


def sampling_uniform(seed: int, position: int) -> float:
    """u ~ U[0, 1) from a counter-based stream keyed by (seed, absolute position); 53 random bits: numpy's
    SeedSequence([seed mod 2^32, seed // 2^32 mod 2^32, position]), its first two uint32 words."""
    s = int(seed) & _MASK64
    w0, w1 = _seed_sequence_words((s & _M32, s >> 32, int(position)))
    bits = (w0 << 21) ^ (w1 >> 11)
    return (bits & ((1 << 53) - 1)) / float(1 << 53)


def sampling_log_probs(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0,
                       min_p: float = 0.0) -> torch.Tensor:
    """log q_τ over the full vocabulary: softmax(logits / τ), then top-k, then top-p, then min-p (τ > 0; float64
    in/out).

    top-k keeps every token whose scaled logit is >= the k-th largest (ties kept); top-p keeps the
    smallest prefix of tokens sorted by probability whose mass reaches top_p; min-p keeps the tokens whose
    probability is at least min_p times the largest (SGLang's order and rule).  Removed tokens get -inf.
    """
    if not temperature > 0:
        raise ValueError(f"sampling_log_probs needs temperature > 0, got {temperature}")
    z = logits / temperature
    if 0 < top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    logq = torch.log_softmax(z, dim=-1)
    if top_p < 1.0:
        probs = logq.exp()
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logq = torch.log_softmax(z.masked_fill(drop, float("-inf")), dim=-1)
    if min_p > 0.0:
        keep = logq.exp() >= min_p * logq.exp().max(dim=-1, keepdim=True).values
        logq = torch.log_softmax(logq.masked_fill(~keep, float("-inf")), dim=-1)
    return logq


def sample_inverse_cdf(logq: torch.Tensor, u: float) -> int:
    """The token y with CDF(y-1) <= u·CDF(V-1) < CDF(y), token-id order (never a zero-probability token)."""
    cdf = torch.cumsum(logq.exp(), dim=-1)
    x = torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype)
    idx = int(torch.searchsorted(cdf, x, right=True)[0])
    idx = min(idx, cdf.shape[-1] - 1)
    while idx > 0 and not torch.isfinite(logq[idx]):  # only when u·total rounds to the very end
        idx -= 1
    return idx


def entropy_from_log_probs(logp: torch.Tensor) -> torch.Tensor:
    """H(p) = -Σ p log p, natural log, over the last axis (0·log 0 = 0)."""
    return torch.special.entr(logp.exp()).sum(dim=-1)


@dataclass(frozen=True)
class VocabStats:
    """Per row of logits [B, V]: the max m, log S = log Σ exp(l - m), the entropy of p0, finiteness."""

    logits: torch.Tensor
    """[B, V], contiguous (float64 with the non-finite entries zeroed on the torch path)."""
    max: torch.Tensor
    log_s: list[float]
    entropy: list[float]
    finite: list[bool]
    kernels: Any = None
    max_values: list[float] = field(default_factory=list)
    """`max` as Python floats."""
    _shifted: dict[tuple[int, int], float] = field(default_factory=dict)

    def shifted(self, row: int, token: int) -> float:
        """l_token - m in double."""
        key = (row, token)
        if key not in self._shifted:
            self._shifted[key] = float(self.logits[row, token]) - self.max_values[row]
        return self._shifted[key]

    def remember(self, row: int, token: int, logit: float) -> None:
        """Record l_token (read by the draw kernel) so that `shifted` need not index the logits."""
        self._shifted[(row, token)] = logit - self.max_values[row]

    def logp0(self, row: int, token: int) -> float:
        return self.shifted(row, token) - self.log_s[row]

    def logq(self, row: int, token: int, temperature: float, log_total: float) -> float:
        return self.shifted(row, token) / temperature - log_total

    def top(self, row: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p0 values [k] float64, token ids [k]) of the k most likely tokens."""
        vals, idx = torch.topk(self.logits[row], k)
        return (vals.to(torch.float64) - self.max_values[row]) - self.log_s[row], idx


def vocab_stats(logits: torch.Tensor, kernels: Any = None) -> VocabStats:
    """VocabStats of logits [B, V] (native kernels when given, else torch in float64)."""
    if kernels is not None:
        lg = logits.contiguous()
        m, log_s, ent, fin = kernels.vocab_stats(lg)
        return VocabStats(lg, m, log_s.tolist(), ent.tolist(), fin.tolist(), kernels, m.tolist())
    lg = logits.to(torch.float64)
    finite_mask = torch.isfinite(lg)
    finite = finite_mask.all(dim=-1).tolist()
    if not all(finite):
        lg = torch.where(finite_mask, lg, torch.zeros((), dtype=lg.dtype))
    m = lg.max(dim=-1).values
    d = lg - m[:, None]
    log_s = torch.logsumexp(d, dim=-1)
    ent = entropy_from_log_probs(d - log_s[:, None])
    return VocabStats(lg.contiguous(), m, log_s.tolist(), ent.tolist(), finite, None, m.tolist())


def restricted_stats(stats: VocabStats, rows: Sequence[int], allowed: np.ndarray) -> VocabStats:
    """VocabStats of rows `rows` of stats.logits with every token outside `allowed` (bool [R, V]) set to -inf:
    the distribution restricted to the allowed tokens and renormalised.  Row j of the result is rows[j]; a row
    that allows no token is not finite.  `draw_tokens` draws from it unchanged (exp(-inf) = 0 in the native
    kernels and in torch; m is the largest allowed logit), and each row is computed alone (batch-invariant).
    Elementwise numpy (no torch intra-op threads: on a busy machine their hand-offs cost more than the work).
    log S (float64) is only read by the torch draw (no native kernels); the entropy is not needed (NaN)."""
    wide = stats.logits if stats.logits.dtype in (torch.float32, torch.float64) else stats.logits.float()  # exact
    logits = wide.numpy()
    lg = np.where(allowed, logits[list(rows)], -np.inf).astype(logits.dtype, copy=False)
    m = lg.max(axis=-1)
    max_values = m.tolist()
    finite = [bool(np.isfinite(v)) for v in max_values]
    log_s = [float("nan")] * len(max_values)
    if stats.kernels is None:
        log_s = [float(np.log(np.exp(lg[j].astype(np.float64) - max_values[j]).sum())) if finite[j] else float("nan")
                 for j in range(len(max_values))]
    masked = torch.from_numpy(np.ascontiguousarray(lg))
    return VocabStats(masked, torch.from_numpy(m), log_s, [float("nan")] * len(max_values), finite, stats.kernels,
                      max_values)


def log_totals(stats: VocabStats, rows: Sequence[int], temperatures: Sequence[float]) -> list[float]:
    """log T_τ = log Σ_v exp((l_v - m) / τ) for each (row, τ) pair; the same sums a draw at τ uses."""
    if not rows:
        return []
    if stats.kernels is not None:
        _, log_t, _ = stats.kernels.draw(stats.logits, stats.max, torch.tensor(list(rows), dtype=torch.long),
                                         torch.tensor(list(temperatures), dtype=torch.float64),
                                         torch.zeros(len(rows), dtype=torch.float64))
        return log_t.tolist()
    return [float(torch.logsumexp((stats.logits[r] - stats.max[r]) / t, dim=-1)) for r, t in zip(rows, temperatures)]


def _draw_filtered(stats: VocabStats, row: int, p: SamplingParams, u: float) -> tuple[int, float]:
    """The torch path: top-k / top-p requests, or every request without the native kernels."""
    lg = stats.logits[row].to(torch.float64)
    if p.temperature == 1.0 and p.top_k < 0 and p.top_p >= 1.0 and p.min_p == 0.0:
        lq = (lg - stats.max_values[row]) - stats.log_s[row]  # = log p0, element for element
    else:
        lq = sampling_log_probs(lg, p.temperature, p.top_k, p.top_p, p.min_p)
    token = sample_inverse_cdf(lq, u)
    return token, float(lq[token])


Draw = tuple[int, float]
"""(y, log q_τ(y))."""


def draw_tokens(stats: VocabStats, requests: Sequence[tuple[int, SamplingParams, int, int]]
                ) -> dict[int, Draw | Exception]:
    """For each (row, params, seed, position): (y, log q_τ(y)) - argmax at τ = 0 (reported: log p0(y), SGLang's
    greedy logprob), else an inverse-CDF draw from q_τ with u = sampling_uniform(seed, position).  A failure is
    returned, not raised."""
    out: dict[int, Draw | Exception] = {}
    plain: list[tuple[int, float, float]] = []
    for row, p, seed, position in requests:
        try:
            if p.temperature == 0:
                token = int(torch.argmax(stats.logits[row]))
                out[row] = (token, stats.logp0(row, token))
            elif stats.kernels is not None and p.top_k < 0 and p.top_p >= 1.0 and p.min_p == 0.0:
                plain.append((row, float(p.temperature), sampling_uniform(seed, position)))
            else:
                out[row] = _draw_filtered(stats, row, p, sampling_uniform(seed, position))
        except Exception as exc:  # reported for this row only
            out[row] = exc
    if plain:
        rows, taus, us = zip(*plain)
        tokens, log_t, logits = stats.kernels.draw(stats.logits, stats.max, torch.tensor(rows, dtype=torch.long),
                                                   torch.tensor(taus, dtype=torch.float64),
                                                   torch.tensor(us, dtype=torch.float64))
        for row, tau, token, lt, logit in zip(rows, taus, tokens.tolist(), log_t.tolist(), logits.tolist()):
            stats.remember(row, token, logit)
            out[row] = (token, stats.logq(row, token, tau, lt))
    return out
