"""The confidence gate of the fast path (pre-positioning paper §2.4, Eqs. 11-12) as pure functions.

    paper                               code
    ℓ(1), ℓ(2)                          top_two(logits)
    γ = ℓ(1) − ℓ(2)           (Eq. 11)  logit_gap, gap_from_top_logprobs
    â = argmax ℓ                        top_two(...)[0]
    τ                                   GateConfig.threshold
    A  (fast-answer set)                GateConfig.fast_answer_set
    gate: γ > τ ∧ â ∈ A       (Eq. 12)  gate_fires, gate_decision (with the reason, for reports)

Top-2 log-probabilities give the same gap as the raw logits: log-softmax subtracts one constant
(log Σ exp ℓ) from every logit, which cancels in ℓ(1) − ℓ(2).  That is what lets the SGLang server, which
returns `top_logprobs_num=2` log-probabilities rather than logits, feed the gate unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


def top_two(logits: np.ndarray) -> tuple[int, float, int, float]:
    """Argmax and runner-up of a logit vector: (id1, ℓ(1), id2, ℓ(2)) (Algorithm 2, line 4).

    Two O(|V|) passes: the vocabulary scan T_scan(V) of Eq. 3.
    """
    v = np.asarray(logits, dtype=np.float64).reshape(-1)
    if v.size < 2:
        raise ValueError(f"logits must hold at least 2 entries, got {v.size}")
    if np.isnan(v).any():
        raise ValueError("logits contain NaN")
    a = int(np.argmax(v))  # lowest id among ties, as numpy and the engines' greedy sampling
    rest = v.copy()
    rest[a] = -np.inf
    b = int(np.argmax(rest))
    return a, float(v[a]), b, float(v[b])


def logit_gap(logits: np.ndarray) -> float:
    """γ = ℓ(1) − ℓ(2), the top-1 to top-2 logit gap of the ready distribution (Eq. 11)."""
    _, l1, _, l2 = top_two(logits)
    return l1 - l2


def gap_from_top_logprobs(top_logprobs: Sequence[Sequence[Any]]) -> tuple[int, float]:
    """(â, γ) from SGLang-shaped top log-probabilities `[[logprob, id, text], ...]` (Eq. 11).

    log p(i) = ℓ_i − log Σ_j exp ℓ_j, so logprob differences equal logit differences.
    """
    if len(top_logprobs) < 2:
        raise ValueError(f"need the top-2 log-probabilities (top_logprobs_num >= 2), got {len(top_logprobs)}")
    entries = sorted(((float(e[0]), int(e[1])) for e in top_logprobs), key=lambda e: (-e[0], e[1]))
    (lp1, id1), (lp2, _) = entries[0], entries[1]
    if not (np.isfinite(lp1) and (np.isfinite(lp2) or lp2 == -np.inf)):
        raise ValueError(f"top log-probabilities must be finite, got {lp1}, {lp2}")
    return id1, lp1 - lp2


def _is_token_id(t: Any) -> bool:
    return isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))


@dataclass(frozen=True)
class GateConfig:
    """The confidence gate of Eq. 12 (validated at construction)."""

    threshold: float = 2.0
    """τ >= 0: the gate fires only when γ > τ (paper default 2.0, inherited from the streaming companion);
    inf: it never fires.  A negative or NaN τ is rejected (γ >= 0 always, so τ < 0 would be 'always')."""
    fast_answer_set: frozenset[int] | None = None
    """A: admissible single-token answers (token ids, non-empty); None admits every token (A = V)."""
    forced: bool = False
    """Benchmarks only: fire whatever γ and â (times the mechanism itself: lock, match, scan)."""

    def __post_init__(self) -> None:
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float, np.floating, np.integer)) or math.isnan(t) or t < 0:
            raise ValueError(f"threshold (τ) must be a number >= 0 (inf: never fires), got {t!r}")
        object.__setattr__(self, "threshold", float(t))
        if self.fast_answer_set is not None:
            if isinstance(self.fast_answer_set, (str, bytes)):
                raise ValueError(f"fast_answer_set (A) must hold token ids, got the string {self.fast_answer_set!r}")
            raw = list(self.fast_answer_set)
            if not raw:
                raise ValueError("fast_answer_set (A) is empty: the gate could never fire (None admits every token)")
            bad = [t for t in raw if not _is_token_id(t) or int(t) < 0]
            if bad:
                raise ValueError(f"fast_answer_set (A) must hold non-negative integer token ids, got {bad[0]!r}")
            object.__setattr__(self, "fast_answer_set", frozenset(int(t) for t in raw))
        if not isinstance(self.forced, bool):
            raise ValueError(f"forced must be a bool, got {self.forced!r}")

    @classmethod
    def forced_open(cls) -> "GateConfig":
        """The benchmark's fast arm: every exact match is served (A = V, no γ test)."""
        return cls(threshold=0.0, fast_answer_set=None, forced=True)

    def check_vocab(self, vocab_size: int) -> None:
        """Reject an answer set with ids outside [0, vocab_size) (a token the model can never produce)."""
        if self.fast_answer_set is not None:
            bad = sorted(t for t in self.fast_answer_set if t >= vocab_size)
            if bad:
                raise ValueError(f"fast_answer_set (A) holds token id {bad[0]} outside the vocabulary [0, {vocab_size})")


@dataclass(frozen=True)
class GateDecision:
    """Whether the gate fires on one ready distribution, and why (for reports and the session demo)."""

    fires: bool
    reason: str


def gate_decision(gap: float, top_token: int, gate: GateConfig, *, token_text: str | None = None) -> GateDecision:
    """Eq. 12 with its explanation: 'γ=3.10 > τ=2 and ' yes' ∈ A', 'γ=0.41 ≤ τ=2', '' The' ∉ A'."""
    shown = repr(token_text) if token_text is not None else f"token {int(top_token)}"
    if gate.forced:
        return GateDecision(True, f"gate forced open (benchmark): γ={gap:.2f}, â={shown}")
    admissible = gate.fast_answer_set is None or int(top_token) in gate.fast_answer_set
    over = bool(gap > gate.threshold)
    where = "∈ A = V" if gate.fast_answer_set is None else ("∈ A" if admissible else "∉ A")
    if over and admissible:
        return GateDecision(True, f"gate fired: γ={gap:.2f} > τ={gate.threshold:g} and â={shown} {where}")
    why = []
    if not over:
        why.append(f"γ={gap:.2f} ≤ τ={gate.threshold:g}")
    if not admissible:
        why.append(f"â={shown} ∉ A")
    return GateDecision(False, "gate not met: " + " and ".join(why))


def gate_fires(gap: float, top_token: int, gate: GateConfig) -> bool:
    """Eq. 12: serve one cached token iff γ > τ and argmax(ℓ) ∈ A (no strings: this is on the fast path)."""
    if gate.forced:
        return True
    admissible = gate.fast_answer_set is None or int(top_token) in gate.fast_answer_set
    return bool(gap > gate.threshold) and admissible
