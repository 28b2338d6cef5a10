"""MH states and the transition kernels of the three power samplers (PowerMH, EntropyCut, MultiTryMH).

A kernel draws the cut of transition j from the decision stream, builds the engine requests of the
proposal at that cut, and scores the generated suffixes into a `Decision` (log A and the proposed state);
the acceptance rules themselves are the pure functions of `acceptance`.  The sequential and the PreSTO
samplers (`samplers`) drive the same kernels, which is what keeps their chains identical (Proposition 1).

    paper                                   code
    x^(k) (MH state: tokens, log q_τ,       ChainState (tokens, logq, logp0, entropy, logq_by_temp)
      log p0, H per position)
    (x_{0:c}, y_{c:T})                      ChainState.splice(cut, suffix)
    c ~ Unif{0..T−1} / ρ_x(c) (EntropyCut)  kernel.cut(state, j, stream); its law kernel.cut_law(state)
    log A(y, x)                             Decision.log_accept
    log r ≤ bound, proposal still decoding  kernel.log_ratio_bound(state, cut, head log q, head log p0)
    M candidates + M − 1 references         MultiTryKernel.requests (2M − 1 requests, one prefix x_{0:c})
    e, the first EOS of a state (eos set)   through_first_eos(tokens, eos): positions t ≤ e

EOS (`SamplerConfig.stop_at_eos`, forerun's eval default).  Proposals stay fixed-length, but the kernels target
    π̃(x) = p0(x_{0:e})^α · g(x_{e+1:T} | x_{0:e})
with e the first EOS of x and g the proposal's own law of the tokens after it (q_τ; MultiTryMH: the mixture over
𝒯 of q_τ' of the whole tail): cut at its first EOS, x then has law ∝ p0(x_{0:e})^α, π_α over EOS-terminated
responses, the references' target (their proposals stop at EOS).  In Eq. 6 the tail's g cancels against the
proposal's q_τ, so every position after the first EOS counts 0 in log q and log p0 (`_through_eos`; in the early-
rejection bound too); scoring the tail too would make the cut response's law ∝ p0(x_{0:e})^α Σ_tail p0(tail | x_{0:e})^α instead.  Without an
EOS in either state the sums are the plain Eq. 6 ones, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
from scipy.special import logsumexp

from .acceptance import (
    cut_by_gumbel_max,
    entropy_cut_law,
    entropy_cut_log_ratio,
    log_acceptance,
    log_mh_ratio,
    log_mh_ratio_bound,
    mtm_log_ratio,
    mtm_log_weight,
    mtm_select,
)
from .suffixes import Suffix, SuffixRequest
from .random_streams import DecisionStream, uniform_cut


# -- states ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChainState:
    """An MH state: the response and its per-position log q_τ, log p0, entropy (and log q per τ' ∈ 𝒯)."""

    tokens: np.ndarray
    logq: np.ndarray
    logp0: np.ndarray
    entropy: np.ndarray
    logq_by_temp: np.ndarray | None = None

    @classmethod
    def empty(cls, n_temps: int | None = None) -> "ChainState":
        z = np.zeros(0)
        return cls(np.zeros(0, dtype=np.int64), z, z, z, None if n_temps is None else np.zeros((n_temps, 0)))

    @property
    def length(self) -> int:
        return len(self.tokens)

    def truncated(self, length: int) -> "ChainState":
        """The first `length` positions of this state."""
        by_temp = None if self.logq_by_temp is None else self.logq_by_temp[:, :length]
        return ChainState(self.tokens[:length], self.logq[:length], self.logp0[:length], self.entropy[:length],
                          by_temp)

    def splice(self, cut: int, suffix: Suffix) -> "ChainState":
        """(x_{0:c}, y_{c:T}): keep [0, cut) of this state, then the generated suffix."""
        if cut < 0 or cut > self.length:
            raise ValueError(f"cut {cut} outside [0, {self.length}]")
        by_temp = None
        if self.logq_by_temp is not None:
            if suffix.logq_by_temp is None:
                raise ValueError("suffix lacks log q per temperature needed by this state")
            by_temp = np.concatenate([self.logq_by_temp[:, :cut], suffix.logq_by_temp], axis=1)
        return ChainState(
            tokens=np.concatenate([self.tokens[:cut], suffix.ids]),
            logq=np.concatenate([self.logq[:cut], suffix.logq]),
            logp0=np.concatenate([self.logp0[:cut], suffix.logp0]),
            entropy=np.concatenate([self.entropy[:cut], suffix.entropy]),
            logq_by_temp=by_temp,
        )


@dataclass(frozen=True)
class Decision:
    """A scored proposal: log A and the state the chain moves to if it accepts."""

    log_accept: float
    proposal: ChainState


def through_first_eos(tokens: np.ndarray, eos: Sequence[int]) -> np.ndarray:
    """[t ≤ e]: the positions up to and including the first EOS (every position when there is none)."""
    hits = np.flatnonzero(np.isin(tokens, np.asarray(eos, dtype=np.int64))) if len(eos) else ()
    keep = np.ones(len(tokens), dtype=bool)
    if len(hits):
        keep[int(hits[0]) + 1:] = False
    return keep


def _through_eos(state: ChainState, eos: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(log q, log p0) of `state` with 0 after its first EOS: the per-position terms of log π̃ − log q_τ."""
    if not len(eos):
        return state.logq, state.logp0
    keep = through_first_eos(state.tokens, eos)
    return np.where(keep, state.logq, 0.0), np.where(keep, state.logp0, 0.0)


# -- kernels -----------------------------------------------------------------------------------------
class TransitionKernel(Protocol):
    state_dependent_cut: bool
    """Whether the cut law depends on the state (EntropyCut).  Below an acceptance the node's state is not
    known before the call, so PreSTO requests the proposal at the root's cut and keeps it only if the cut
    drawn from the node's own state, once generated, is the same (see `EntropyCutKernel`)."""

    def cut_law(self, state: ChainState) -> np.ndarray: ...

    def cut(self, state: ChainState, j: int, stream: DecisionStream) -> int: ...

    def cuts(self, state: ChainState, transitions: Sequence[int], stream: DecisionStream) -> list[int]: ...

    def requests(self, prefix_ids: tuple[int, ...], cut: int, horizon: int, j: int,
                 stream: DecisionStream) -> list[SuffixRequest]: ...

    def decide(self, state: ChainState, cut: int, suffixes: Sequence[Suffix], j: int,
               stream: DecisionStream) -> Decision: ...


class UniformCut:
    """The uniform cut law c ~ Unif{0..T−1} of PowerMH and MultiTryMH (§3.1), independent of the state."""

    def cut_law(self, state: ChainState) -> np.ndarray:
        return np.full(state.length, 1.0 / state.length)

    def cut(self, state: ChainState, j: int, stream: DecisionStream) -> int:
        return uniform_cut(stream.cut_uniform(j), state.length)

    def cuts(self, state: ChainState, transitions: Sequence[int], stream: DecisionStream) -> list[int]:
        return [self.cut(state, j, stream) for j in transitions]


@dataclass(frozen=True)
class PowerMHKernel(UniformCut):
    """Uniform cut over the response, suffix from q_τ, Eq. 6."""

    alpha: float
    tau: float
    state_dependent_cut: bool = False
    eos: tuple[int, ...] = ()
    """EOS ids (`SamplerConfig.stop_at_eos`): positions after a state's first EOS count 0 (module docstring)."""

    def requests(self, prefix_ids, cut, horizon, j, stream):
        return [SuffixRequest(prefix_ids, horizon - cut, self.tau, stream.suffix_seed(j))]

    def log_ratio(self, state: ChainState, proposal: ChainState, cut: int) -> float:
        return log_mh_ratio(*_through_eos(state, self.eos), *_through_eos(proposal, self.eos), cut, self.alpha)

    @property
    def rejects_early(self) -> bool:
        """Whether a rejection can be decided before the proposal is complete: τ = 1/α, α ≥ 1, where each proposal
        token can only lower log r (`acceptance.log_mh_ratio_bound`; a token after the first EOS adds 0)."""
        return self.alpha >= 1.0 and abs(self.alpha * self.tau - 1.0) <= 1e-12

    def log_ratio_bound(self, state: ChainState, cut: int, head_logq: Sequence[float],
                        head_logp0: Sequence[float], head_ids: Sequence[int] = ()) -> float | None:
        """An upper bound of log r given the proposal's first tokens (their log q_τ and log p0; with EOS ids also
        their ids, as `log_ratio` counts only the tokens through the first EOS), or None when this kernel has none
        (`rejects_early`, or EOS ids without the head's ids)."""
        if not self.rejects_early or (self.eos and len(head_ids) != len(head_logq)):
            return None
        hq, hp = np.asarray(head_logq, dtype=np.float64), np.asarray(head_logp0, dtype=np.float64)
        if self.eos:
            keep = through_first_eos(np.concatenate([state.tokens[:cut], np.asarray(head_ids, dtype=np.int64)]),
                                     self.eos)[cut:]
            hq, hp = np.where(keep, hq, 0.0), np.where(keep, hp, 0.0)
        return log_mh_ratio_bound(*_through_eos(state, self.eos), hq, hp, cut, self.alpha,
                                  state.length - cut - len(head_logq))

    def decide(self, state, cut, suffixes, j, stream):
        (suffix,) = suffixes
        proposal = state.splice(cut, suffix)
        return Decision(log_acceptance(self.log_ratio(state, proposal, cut)), proposal)


@dataclass(frozen=True)
class EntropyCutKernel(PowerMHKernel):
    """Cut c = argmax_t log ρ_x(t) + G_{j,t} (Gumbel-max, an exact draw from ρ_x ∝ max(ΔH, 0)^β, ΔH_0 = H_0);
    Eq. 6 + cut-law correction.

    Why PreSTO can prefetch below an acceptance exactly: a node v whose state shares the root's prefix up to
    κ(v) has the root's weights at t ≤ κ(v) (H_t depends on x_{0:t} only) and the same Gumbels, so if the
    root's cut c_j ≤ κ(v), v's own cut is c_j again or lies beyond κ(v).  The request at the root's c_j (the
    one every node at that depth shares) is therefore v's request exactly when `cut(v's state)` returns c_j,
    which is checked once v's state is generated; otherwise v's cut violates Condition 1 and the request is
    deferred, as it would have been had it been known.  (The inverse CDF has no such property: its cut
    depends on the normalizer of the law, i.e. on entropies after the cut generated in the same call.)"""

    beta: float = 4.0
    state_dependent_cut: bool = True

    def cut_law(self, state: ChainState) -> np.ndarray:
        return entropy_cut_law(state.entropy, self.beta)

    def cut(self, state: ChainState, j: int, stream: DecisionStream) -> int:
        return cut_by_gumbel_max(self.cut_law(state), stream.cut_gumbels(j, state.length))

    def cuts(self, state: ChainState, transitions: Sequence[int], stream: DecisionStream) -> list[int]:
        law = self.cut_law(state)
        return [cut_by_gumbel_max(law, stream.cut_gumbels(j, state.length)) for j in transitions]

    @property
    def rejects_early(self) -> bool:
        return False  # (the cut-law correction is not bounded here)

    def log_ratio(self, state: ChainState, proposal: ChainState, cut: int) -> float:
        (xq, xp), (yq, yp) = _through_eos(state, self.eos), _through_eos(proposal, self.eos)
        return entropy_cut_log_ratio(xq, xp, state.entropy, yq, yp, proposal.entropy, cut, self.alpha, self.beta)


@dataclass(frozen=True)
class MultiTryKernel(UniformCut):
    """Multiple-try Metropolis with the temperature-mixture proposal (see `acceptance`)."""

    alpha: float
    temperatures: tuple[float, ...]
    candidates: int = 4
    state_dependent_cut: bool = False
    eos: tuple[int, ...] = ()
    """EOS ids (`SamplerConfig.stop_at_eos`): π̃ of the module docstring in the weights."""

    def log_weight(self, y: ChainState, cut: int) -> float:
        """log w(y) = log π̃(y) − log Q(y_{c:T} | x_{0:c}) up to a constant of the transition: `mtm_log_weight` with
        log p0 counted through the first EOS e, plus log g(y_{e+1:T}), g the mixture over 𝒯 of the tail."""
        logp0 = _through_eos(y, self.eos)[1]
        keep = through_first_eos(y.tokens, self.eos)
        tail = 0.0
        if not keep.all():
            tail = float(logsumexp(np.sum(y.logq_by_temp[:, ~keep], axis=1)) - np.log(y.logq_by_temp.shape[0]))
        return mtm_log_weight(logp0, y.logq_by_temp, cut, self.alpha) + tail

    def requests(self, prefix_ids, cut, horizon, j, stream):
        n = len(self.temperatures)
        out = [SuffixRequest(prefix_ids, horizon - cut, self.temperatures[stream.slot_choice(j, i, n)],
                             stream.suffix_seed(j, i)) for i in range(self.candidates)]
        out += [SuffixRequest(prefix_ids, horizon - cut,
                              self.temperatures[stream.slot_choice(j, i, n, reference=True)],
                              stream.reference_seed(j, i)) for i in range(self.candidates - 1)]
        return out

    def decide(self, state, cut, suffixes, j, stream):
        m = self.candidates
        if len(suffixes) != 2 * m - 1:
            raise ValueError(f"MultiTryMH expects {2 * m - 1} suffixes, got {len(suffixes)}")
        if state.logq_by_temp is None:
            raise ValueError("MultiTryMH states need log q per temperature")
        cands = [state.splice(cut, s) for s in suffixes[:m]]
        refs = [state.splice(cut, s) for s in suffixes[m:]]
        lw = [self.log_weight(y, cut) for y in cands]
        chosen = mtm_select(lw, stream.select_uniform(j))
        ref_lw = [self.log_weight(r, cut) for r in refs]
        ref_lw.append(self.log_weight(state, cut))
        return Decision(log_acceptance(mtm_log_ratio(lw, ref_lw)), cands[chosen])
