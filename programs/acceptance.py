"""MH acceptance rules of the three power samplers, as pure functions over per-position arrays.

A state x of block ℓ is a response of T = ℓB tokens; the arrays below are indexed by response position
t = 0..T-1 (position t holds token x_{t+1} of the paper, generated from the prefix x_{0:t}).  A cut c keeps
positions [0, c) and resamples [c, T).  π_α(x) ∝ p0(x)^α (Eq. 2, 4).

    paper                                   code
    α, τ = 1/α                              alpha, temperature
    c (cut index)                           cut
    log q_τ(x_{c+1:T} | x_{0:c})            suffix_sum(logq, cut)
    log p0(x_{c+1:T} | x_{0:c})             suffix_sum(logp0, cut)
    log A(y, x) (Eq. 6)                     log_acceptance(log_mh_ratio(...))
    log r ≤ bound while y is generated      log_mh_ratio_bound(...) (τ = 1/α: an exact early rejection)
    H_t (entropy of p0, App. D.3)           entropy[t]
    ΔH_t                                    entropy_jumps(entropy)[t]
    ρ_x(c) ∝ max(ΔH_c, 0)^β (β = 4)         entropy_cut_law(entropy, beta)
    c = argmax_t log ρ_x(t) + G_t           cut_by_gumbel_max(law, gumbels)
    ε (0.01)                                EPSILON
    ε-certain reject / accept / uncertain   epsilon_class(A, epsilon) ∈ CLASSES (App. C.3 order)
    MTM weight w(y) = π(y)/Q(y|x_{0:c})     mtm_log_weight(...)
    Q = (1/|𝒯|) Σ_τ q_τ (mixture proposal)  mixture_log_density(logq_by_temp, cut)

Derivations
-----------
PowerMH (Karan & Du; App. B.1).  c ~ Unif{0..T-1} independently of the state; y = (x_{0:c}, y_{c:T}),
y_{c:T} ~ q_τ(· | x_{0:c}).  The reverse move uses the same cut, so q(x|y,c)/q(y|x,c) =
q_τ(x_{c:T}|x_{0:c}) / q_τ(y_{c:T}|x_{0:c}); the target ratio keeps only the resampled suffix because the
prefix is shared.  Hence Eq. 6:
    log r = [Σ_{t≥c} log q_τ(x_t) − Σ_{t≥c} log q_τ(y_t)] + α [Σ_{t≥c} log p0(y_t) − Σ_{t≥c} log p0(x_t)],
    log A = min(0, log r).  Each cut-conditional kernel is π_α-reversible, so is their mixture over c.

EntropyCut (Zhou et al.).  The cut law depends on the state: ρ_x(c) ∝ max(ΔH_c(x), 0)^β with
    ΔH_0 := H_0,   ΔH_t := H_t − H_{t−1}  (t = 1..T−1),
where H_t is the natural-log entropy of p0(· | x_{0:t}) over the full vocabulary (the distribution response
token t is drawn from; H_0 is the entropy at the prompt's last position, the distribution that produced x_1).
ΔH_0 = H_0 is the jump from 0: Zhou et al.'s reference implementation weights cuts by
clip(diff(H, prepend=0), 0)^β, so cut 0 (resample the whole response) has weight H_0^β.  The PreSTO paper
describes EntropyCut only as "cuts where the entropy increases" and does not say what happens at position 0.
Setting ΔH_0 := 0 instead (this module's first version) gives cut 0 probability zero: x_1 then keeps its
initial draw forever and the chain is reducible (tests/programs/test_convergence.py).
If every weight is zero the law falls back to Unif{0..T−1} (a function of the state, so the correction below
stays exact).  For detailed balance of the kernel Σ_c ρ_x(c) q(y|x,c) A, each c must satisfy
π(x) ρ_x(c) q(y|x,c) A(y,x) = π(y) ρ_y(c) q(x|y,c) A(x,y), which gives
    log r_EC = log r_Eq.6 + log ρ_y(c) − log ρ_x(c).
Why the correction stays exact with ΔH_0 = H_0: the weight at t depends on H_0..H_t, and H_t depends only on
the prefix x_{0:t}; for t ≤ c that prefix is shared by x and y = (x_{0:c}, y_{c:T}), so the weights at t ≤ c
agree (H_0 depends on the prompt alone and is shared by every state).  ρ_y(c) differs from ρ_x(c) only
through the normalizer (positions > c), which the correction evaluates exactly.  ρ_y(c) = 0 (possible only
under the fallback) gives A = 0.
The cut itself is drawn by Gumbel-max, c = argmax_t (log ρ_x(t) + G_t) with G_t i.i.d. standard Gumbel keyed
by the transition (`cut_by_gumbel_max`): an exact draw from ρ_x.  Unlike the inverse CDF, it decides the cut
from the weights at t ≤ c alone whenever c wins: a state y that shares x's prefix up to κ ≥ c has the same
scores at t ≤ κ, so its cut is either c again or lies beyond κ.  PreSTO uses this to request EntropyCut
proposals below acceptances and validate them after generation (`transitions.EntropyCutKernel`).

MultiTryMH (simplified EGPS, Liu et al. 2000).  Fix the cut c (uniform, state-independent) and the prefix
P = x_{0:c}.  Each candidate draws a temperature τ ~ Unif(𝒯), 𝒯 = {0.25, 0.5, 1.0}, then a suffix from
q_τ(·|P): marginally every candidate is an i.i.d. draw from the mixture Q(s|P) = (1/|𝒯|) Σ_τ q_τ(s|P),
so the MTM proposal kernel is T(x, y) = Q(y_{c:T} | x_{0:c}) [y_{0:c} = x_{0:c}].  With Liu et al.'s choice
λ(x,y) = 1/(T(x,y) T(y,x)) the weight is w(y, x) = π(y)/T(x, y); since π(y) = p0(P)^α p0(y_{c:T}|P)^α / Z
and p0(P) is common to every sequence in the transition,
    log w(s) = α Σ_{t≥c} log p0(s_t) − log Q(s | P)        (mtm_log_weight).
Algorithm: draw y_1..y_M ~ Q(·|P); select J with probability w(y_J)/Σ w(y_i); draw reference points
x*_1..x*_{M−1} ~ T(y_J, ·) = Q(·| y_{J,0:c}) — and y_{J,0:c} = P, so the references are fresh i.i.d. draws
from the SAME prefix (they can be generated in the same batch as the candidates); set x*_M = x; accept
y_J with
    log A = min(0, log Σ_i w(y_i) − log Σ_i w(x*_i))                       (mtm_log_ratio).
Liu et al. prove detailed balance for any symmetric λ; the mixture over c is again reversible.
Q needs log q_τ of every token under every τ in 𝒯 (not just the one it was sampled at): the state keeps a
(|𝒯|, T) array of them.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy.special import logsumexp

EPSILON = 0.01
"""ε of the ε-certainty classes (§3.3, Table 6b)."""

CLASSES: tuple[str, str, str] = ("reject", "accept", "uncertain")
"""The three ε-certainty classes, in the order of App. C.3 / E.7 (class indices 0, 1, 2)."""


def _as_array(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return arr


def _check_cut(cut: int, horizon: int) -> None:
    if not (0 <= cut < horizon):
        raise ValueError(f"cut must be in [0, {horizon}), got {cut}")


def suffix_sum(values: Sequence[float] | np.ndarray, cut: int) -> float:
    """Σ_{t ≥ c} values[t]: a suffix log-probability as a sum of token log-probabilities (App. B.1)."""
    arr = _as_array(values, "values")
    _check_cut(cut, len(arr))
    return float(np.sum(arr[cut:]))


def log_mh_ratio(
    current_logq: Sequence[float],
    current_logp0: Sequence[float],
    proposal_logq: Sequence[float],
    proposal_logp0: Sequence[float],
    cut: int,
    alpha: float,
) -> float:
    """Unclamped log MH ratio of suffix resampling at `cut` (the argument of min in Eq. 6).

    All arrays are full-length (T) per-position arrays of the current state x and the proposal y
    (y shares x's prefix [0, cut)); only positions [cut, T) enter.
    """
    arrays = [_as_array(a, n) for a, n in ((current_logq, "current_logq"), (current_logp0, "current_logp0"),
                                         (proposal_logq, "proposal_logq"), (proposal_logp0, "proposal_logp0"))]
    horizon = len(arrays[0])
    if any(len(a) != horizon for a in arrays):
        raise ValueError(f"per-position arrays must have equal length, got {[len(a) for a in arrays]}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    _check_cut(cut, horizon)
    xq, xp, yq, yp = (float(np.sum(a[cut:])) for a in arrays)
    return (xq - yq) + alpha * (yp - xp)


BOUND_SLACK_PER_TOKEN = 1e-6
"""What `log_mh_ratio_bound` allows a proposal token still to come to add (mathematically at most 0; a token's
log p0 and log q_τ come from double-precision log-sums, ~1e-12 off; a proposal term of this engine's chains
is -1.4 on average, the largest seen -7e-7)."""


def log_mh_ratio_bound(current_logq: Sequence[float], current_logp0: Sequence[float],
                       head_logq: Sequence[float], head_logp0: Sequence[float], cut: int, alpha: float,
                       remaining: int) -> float:
    """An upper bound of the log MH ratio of Eq. 6 while the proposal is still being generated, whatever its
    `remaining` tokens turn out to be: valid for τ = 1/α, α ≥ 1 (`PowerMHKernel.rejects_early`).

    Each proposal token y_t contributes α log p0(y_t) − log q_τ(y_t) to log r.  With q_τ ∝ p0^{1/τ} = p0^α over
    the full vocabulary that is α log p0 − (α log p0 − log Σ_v p0(v)^α) = log Σ_v p0(v)^α ≤ 0, since
    p0(v)^α ≤ p0(v) for α ≥ 1.  So log r only falls as the proposal grows: its value over the current state's
    suffix and the proposal's first tokens (`head_*`), plus a numerical slack for the rest and for the order of
    the sums, bounds the complete proposal's log r, and log u ≥ the bound decides a rejection exactly (the
    sequential sampler's decision on the whole proposal)."""
    xq, xp, hq, hp = (_as_array(a, n) for a, n in ((current_logq, "current_logq"), (current_logp0, "current_logp0"),
                                                  (head_logq, "head_logq"), (head_logp0, "head_logp0")))
    if len(xq) != len(xp) or len(hq) != len(hp):
        raise ValueError("log q and log p0 must have one entry per token")
    _check_cut(cut, len(xq))
    if remaining < 0:
        raise ValueError(f"remaining must be >= 0, got {remaining}")
    terms = np.concatenate([xq[cut:] - alpha * xp[cut:], alpha * hp - hq])
    scale = float(np.sum(np.abs(xq[cut:])) + alpha * np.sum(np.abs(xp[cut:])) + np.sum(np.abs(hq))
                  + alpha * np.sum(np.abs(hp)))
    return float(np.sum(terms)) + BOUND_SLACK_PER_TOKEN * max(alpha, 1.0) * remaining + 1e-12 * (1.0 + scale)


def log_acceptance(log_ratio: float) -> float:
    """log A = min(0, log r) (Eq. 6); NaN is rejected as an error."""
    if math.isnan(log_ratio):
        raise ValueError("log MH ratio is NaN")
    return min(0.0, log_ratio)


def accept_decision(log_u: float, log_accept: float) -> bool:
    """The MH decision used identically by the sequential and PreSTO samplers: accept iff log u < log A."""
    return log_u < log_accept


def epsilon_class(accept_prob: float, epsilon: float = EPSILON) -> str:
    """ε-certainty class of a decision (§3.3): reject if A ≤ ε, accept if A ≥ 1 − ε, else uncertain."""
    if not (0.0 < epsilon < 0.5):
        raise ValueError(f"epsilon must be in (0, 0.5), got {epsilon}")
    if not (0.0 <= accept_prob <= 1.0):
        raise ValueError(f"accept_prob (the acceptance probability A) must be in [0, 1], got {accept_prob}")
    reject, accept, uncertain = CLASSES
    if accept_prob <= epsilon:
        return reject
    if accept_prob >= 1.0 - epsilon:
        return accept
    return uncertain


# -- EntropyCut ---------------------------------------------------------------------------------------
def entropy_jumps(entropy: Sequence[float]) -> np.ndarray:
    """ΔH_0 = H_0, ΔH_t = H_t − H_{t−1} for t ≥ 1: Zhou et al.'s diff(H, prepend=0) (module docstring)."""
    h = _as_array(entropy, "entropy")
    if len(h) == 0:
        raise ValueError("entropy must be non-empty")
    return np.diff(h, prepend=0.0)


def entropy_cut_law(entropy: Sequence[float], beta: float) -> np.ndarray:
    """ρ(c) ∝ max(ΔH_c, 0)^β over c = 0..T−1; uniform if no jump is positive (documented fallback).  Where ΔH^β
    overflows or every positive one underflows (a large β: 3^1000 = inf, 0.4^1000 = 0) the law is normalized in
    log space; it used to fall back to uniform there, giving cuts with no entropy jump the mass of the largest."""
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    jumps = entropy_jumps(entropy)
    if not np.all(np.isfinite(jumps)):
        raise ValueError("entropy contains non-finite values")
    with np.errstate(over="ignore", under="ignore"):
        weights = np.maximum(jumps, 0.0) ** beta
    total = float(np.sum(weights))
    if 0.0 < total < math.inf:
        return weights / total
    up = jumps > 0.0
    if not np.any(up):
        return np.full(len(weights), 1.0 / len(weights))
    log_w = np.where(up, beta * np.log(np.where(up, jumps, 1.0)), -np.inf)
    w = np.exp(log_w - np.max(log_w))
    return w / float(np.sum(w))


def cut_from_law(law: Sequence[float] | np.ndarray, u: float) -> int:
    """Inverse CDF: the smallest c with Σ_{t≤c} ρ(t) > u, skipping zero-probability cuts."""
    probs = _as_array(law, "law")
    if not (0.0 <= u < 1.0):
        raise ValueError(f"u must be in [0, 1), got {u}")
    cdf = np.cumsum(probs)
    cdf /= cdf[-1]
    idx = int(np.searchsorted(cdf, u, side="right"))
    idx = min(idx, len(probs) - 1)
    while probs[idx] <= 0.0 and idx > 0:  # u landed on a flat part at the top (rounding): step back
        idx -= 1
    return idx


def cut_by_gumbel_max(law: Sequence[float] | np.ndarray, gumbels: Sequence[float] | np.ndarray) -> int:
    """c = argmax_t (log ρ(t) + G_t): with G_t i.i.d. standard Gumbel, an exact draw from ρ (zero-probability
    cuts never win).  Whenever the winner c lies at or before κ, it is decided by the scores at t ≤ κ alone."""
    probs = _as_array(law, "law")
    g = _as_array(gumbels, "gumbels")
    if len(g) != len(probs):
        raise ValueError(f"need one Gumbel per cut: {len(g)} for a law over {len(probs)} cuts")
    if not np.any(probs > 0.0):
        raise ValueError("the cut law has no positive entry")
    with np.errstate(divide="ignore"):
        scores = np.where(probs > 0.0, np.log(probs), -np.inf) + g
    return int(np.argmax(scores))


def entropy_cut_log_ratio(
    current_logq: Sequence[float],
    current_logp0: Sequence[float],
    current_entropy: Sequence[float],
    proposal_logq: Sequence[float],
    proposal_logp0: Sequence[float],
    proposal_entropy: Sequence[float],
    cut: int,
    alpha: float,
    beta: float,
) -> float:
    """EntropyCut log MH ratio: Eq. 6 plus the cut-law correction log ρ_y(c) − log ρ_x(c)."""
    base = log_mh_ratio(current_logq, current_logp0, proposal_logq, proposal_logp0, cut, alpha)
    rho_x = float(entropy_cut_law(current_entropy, beta)[cut])
    rho_y = float(entropy_cut_law(proposal_entropy, beta)[cut])
    if rho_x <= 0.0:
        raise ValueError(f"cut {cut} has zero probability under the current state's cut law")
    if rho_y <= 0.0:
        return -math.inf
    return base + math.log(rho_y) - math.log(rho_x)


# -- MultiTryMH ---------------------------------------------------------------------------------------
def mixture_log_density(logq_by_temp: np.ndarray, cut: int) -> float:
    """log Q(s | P) = log (1/|𝒯|) Σ_τ Π_{t≥c} q_τ(s_t | ·) from a (|𝒯|, T) array of token log q_τ."""
    arr = np.asarray(logq_by_temp, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 1:
        raise ValueError(f"logq_by_temp must have shape (n_temperatures, T), got {arr.shape}")
    _check_cut(cut, arr.shape[1])
    sums = np.sum(arr[:, cut:], axis=1)
    return float(logsumexp(sums) - math.log(arr.shape[0]))


def mtm_log_weight(logp0: Sequence[float], logq_by_temp: np.ndarray, cut: int, alpha: float) -> float:
    """log w(s) = α log p0(s_{c:T} | P) − log Q(s_{c:T} | P), up to a constant shared by the transition."""
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    return alpha * suffix_sum(logp0, cut) - mixture_log_density(logq_by_temp, cut)


def mtm_select(log_weights: Sequence[float], u: float) -> int:
    """Index J drawn with probability w_J / Σ w_i by inverse CDF at u ∈ [0, 1)."""
    lw = _as_array(log_weights, "log_weights")
    if len(lw) == 0:
        raise ValueError("need at least one candidate")
    if not (0.0 <= u < 1.0):
        raise ValueError(f"u must be in [0, 1), got {u}")
    if np.all(np.isneginf(lw)):
        raise ValueError("every MTM candidate has zero weight")
    probs = np.exp(lw - logsumexp(lw))
    return cut_from_law(probs, u)


def mtm_log_ratio(candidate_log_weights: Sequence[float], reference_log_weights: Sequence[float]) -> float:
    """log Σ_i w(y_i) − log Σ_i w(x*_i); the references include the current state x as x*_M."""
    cand = _as_array(candidate_log_weights, "candidate_log_weights")
    ref = _as_array(reference_log_weights, "reference_log_weights")
    if len(cand) == 0 or len(cand) != len(ref):
        raise ValueError(f"need M candidates and M references (incl. the current state), got {len(cand)}, {len(ref)}")
    return float(logsumexp(cand) - logsumexp(ref))
