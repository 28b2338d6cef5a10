"""Features 3 and 4 of the certainty classifier study (PreSTO App. E.7): statistics of the ROOT state at a cut.

Known before the round's call (the root state is), so they are features of a candidate node: the samplers
write them into every node record and hand them to the planner per depth (`plan_prefetch(depth_features=)`).

    paper (App. E.7)                                        code (record field)
    Feature 3: token-wise log-likelihood of the root state under the proposal LLM, log q_τ(x_t | x_{0:t}):
      its value at the first resampled token (t = c)        logq_at_cut
      its change into that token, a_c − a_{c−1}             logq_jump_in
      its change out of it, a_{c+1} − a_c                   logq_jump_out
      its mean over the suffix after the cut, t = c..T−1    logq_suffix_mean
    Feature 4: the same four of the entropy H_t of p0        entropy_at_cut, entropy_jump_in,
      (EntropyCut's quantity)                                entropy_jump_out, entropy_suffix_mean

forerun adds one statistic the MH ratio itself names (not in the paper's study).  With the proposal q_τ = p0^α / Z_t
token by token (τ = 1/α), log r = Σ_{t≥c} log Z_t(y) − Σ_{t≥c} log Z_t(x) (`acceptance.log_mh_ratio`), and the
current state's half is known before the call:

    log Z_t = α log p0 − log q_τ (≤ 0) of the root state:
      its sum over the suffix, t = c..T−1                  logz_suffix_sum
      (T − c) × its mean over the whole state              logz_suffix_expected  (what a proposal's sum is like)

Edges: the change into position 0 is the jump from 0 (a_0 − 0, the convention of EntropyCut's ΔH_0 = H_0,
`acceptance.entropy_jumps`); the change out of the last position is 0 (there is no next token).  Entropy
statistics are left out when the backend reports no entropy (NaN).
"""

from __future__ import annotations

import math

import numpy as np

from .transitions import ChainState

LIKELIHOOD_FEATURES: tuple[str, ...] = ("logq_at_cut", "logq_jump_in", "logq_jump_out", "logq_suffix_mean")
"""Feature 3 (record field names)."""

ENTROPY_FEATURES: tuple[str, ...] = ("entropy_at_cut", "entropy_jump_in", "entropy_jump_out", "entropy_suffix_mean")
"""Feature 4 (record field names)."""

RATIO_FEATURES: tuple[str, ...] = ("logz_suffix_sum", "logz_suffix_expected")
"""The current state's half of log r and what a proposal's half is like (record field names; forerun's)."""


def cut_statistics(values: np.ndarray, cut: int) -> tuple[float, float, float, float]:
    """(a_c, a_c − a_{c−1}, a_{c+1} − a_c, mean a_{c:T}) of a per-position array a at cut c (edges above)."""
    a = np.asarray(values, dtype=np.float64)
    if not 0 <= cut < len(a):
        raise ValueError(f"cut must be in [0, {len(a)}), got {cut}")
    into = a[cut] - (a[cut - 1] if cut > 0 else 0.0)
    out = a[cut + 1] - a[cut] if cut + 1 < len(a) else 0.0
    return float(a[cut]), float(into), float(out), float(np.mean(a[cut:]))


def root_cut_features(root: ChainState, cut: int, alpha: float | None = None) -> dict[str, float]:
    """Features 3 (and 4 when the entropy is known) of the root state at `cut`, by record field name; with the
    power exponent `alpha`, also the log-ratio statistics (`RATIO_FEATURES`)."""
    out = dict(zip(LIKELIHOOD_FEATURES, cut_statistics(root.logq, cut)))
    if root.length and all(math.isfinite(h) for h in root.entropy):
        out.update(zip(ENTROPY_FEATURES, cut_statistics(root.entropy, cut)))
    if alpha is not None:
        log_z = alpha * np.asarray(root.logp0, dtype=np.float64) - np.asarray(root.logq, dtype=np.float64)
        out["logz_suffix_sum"] = float(np.sum(log_z[cut:]))
        out["logz_suffix_expected"] = float((len(log_z) - cut) * np.mean(log_z))
    return out


class RootCutFeatures:
    """`root_cut_features` of one root state, computed once per cut: a PreSTO round reads the same cut for its
    depth's planning features and for the record of every node scored at that depth."""

    def __init__(self, root: ChainState, alpha: float | None = None) -> None:
        self.root, self.alpha = root, alpha
        self._by_cut: dict[int, dict[str, float]] = {}

    def at(self, cut: int) -> dict[str, float]:
        """The features at `cut` (a fresh dict each call: a record may extend its own)."""
        if cut not in self._by_cut:
            self._by_cut[cut] = root_cut_features(self.root, cut, self.alpha)
        return dict(self._by_cut[cut])
