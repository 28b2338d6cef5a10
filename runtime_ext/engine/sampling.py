"""Per-token sampling math of the embedded engine: pure functions over logits (no engine state).

    paper / notion                        code
    u(seed, p), the sampling noise        sampling_uniform(seed, position)
    log p0(· | y_<t), H(p0(· | y_<t))     next_token_log_probs(logits)  (entropy_from_log_probs)
    log q_τ(· | y_<t)                     sampling_log_probs(logits, τ, top_k, top_p)
    y_t ~ q_τ (inverse CDF, one u)        sample_inverse_cdf(log q_τ, u)  via draw_token(...)
    log q_τ'(y_t | ·) at extra τ'         logq_at_temperatures(logits, y_t, τ')

q_τ is the full-vocabulary distribution softmax(logits / τ) restricted by top-k / top-p when (and only
when) the request asks for it; τ = 0 is argmax (q is the point mass, log q = 0).  The token is drawn by
inverse-CDF sampling (token-id order) with ONE uniform u from a counter-based stream keyed by
(seed, absolute position) - so the drawn tokens never depend on batch composition or scheduling.
"""

from __future__ import annotations

import numpy as np
import torch

from ..protocol import SamplingParams

_MASK64 = (1 << 64) - 1


def sampling_uniform(seed: int, position: int) -> float:
    """u ~ U[0, 1) from a counter-based stream keyed by (seed, absolute position); 53 random bits."""
    s = int(seed) & _MASK64
    state = np.random.SeedSequence([s & 0xFFFFFFFF, s >> 32, int(position)]).generate_state(2, np.uint32)
    bits = (int(state[0]) << 21) ^ (int(state[1]) >> 11)
    return (bits & ((1 << 53) - 1)) / float(1 << 53)


def sampling_log_probs(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """log q_τ over the full vocabulary: softmax(logits / τ), then top-k, then top-p (τ > 0; float64 in/out).

    top-k keeps every token whose scaled logit is >= the k-th largest (ties kept); top-p keeps the
    smallest prefix of tokens sorted by probability whose mass reaches top_p.  Removed tokens get -inf.
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


def next_token_log_probs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[float], list[bool]]:
    """For logits [B, V]: (float64 logits, log p0, H(p0) per row, which rows are finite).

    A row with a NaN/inf logit has those entries zeroed so that the other rows' arithmetic stays finite;
    the caller fails that row."""
    lg = logits.to(torch.float64)
    finite_mask = torch.isfinite(lg)
    finite = finite_mask.all(dim=-1).tolist()
    if not all(finite):
        lg = torch.where(finite_mask, lg, torch.zeros((), dtype=lg.dtype))
    logp0 = torch.log_softmax(lg, dim=-1)
    return lg, logp0, entropy_from_log_probs(logp0).tolist(), finite


def draw_token(logits: torch.Tensor, logp0: torch.Tensor, params: SamplingParams, seed: int,
               position: int) -> tuple[int, float]:
    """(y, log q_τ(y)) for one row: argmax at τ = 0 (log q = 0), else an inverse-CDF draw from q_τ with
    u = sampling_uniform(seed, position); at τ = 1 without top-k/top-p, q_τ is p0 itself."""
    p = params
    if p.temperature == 0:
        return int(torch.argmax(logits)), 0.0
    if p.temperature == 1.0 and p.top_k < 0 and p.top_p >= 1.0:
        lq = logp0
    else:
        lq = sampling_log_probs(logits, p.temperature, p.top_k, p.top_p)
    token = sample_inverse_cdf(lq, sampling_uniform(seed, position))
    return token, float(lq[token])


def logq_at_temperatures(logits: torch.Tensor, token: int, temperatures: tuple[float, ...]) -> list[float]:
    """log q_τ'(token) = z_token / τ' - logsumexp(z / τ') over the full vocabulary, for each τ'."""
    return [float(logits[token] / t - torch.logsumexp(logits / t, dim=-1)) for t in temperatures]
