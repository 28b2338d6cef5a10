"""Gate calibration: the selective-prediction sweep of τ (pre-positioning paper §2.4, §5, Figure 7).

From measured pairs (logit gap γ, argmax ∈ A, served token correct) the sweep gives, per threshold τ,

    c(τ) = Pr(γ > τ ∧ argmax ∈ A)                       (Eq. 13, coverage)
    r(τ) = Pr(served token wrong | accepted)             (Eq. 14, false-accept rate)

with Wilson 95 % intervals (scipy.stats.binomtest(...).proportion_ci(method="wilson")), and picks the
smallest τ with r(τ) ≤ r_max (maximum coverage at bounded risk).

    paper                 code
    γ                     GatePair.logit_gap
    argmax ∈ A            GatePair.in_answer_set
    served token wrong    not GatePair.correct
    τ                     GatePoint.threshold
    c(τ), r(τ)            GatePoint.coverage, GatePoint.false_accept
    r_max                 pick_threshold(..., r_max); calibrate_held_out (pick on one set, judge on another)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..harness.intervals import wilson_interval


@dataclass(frozen=True)
class GatePair:
    """One measured decision point."""

    logit_gap: float
    """γ of the ready distribution (Eq. 11)."""
    in_answer_set: bool
    """argmax ∈ A."""
    correct: bool
    """The served (cached) token agrees with the reference: the model's own full-path output (Eq. 14)."""


@dataclass(frozen=True)
class GatePoint:
    """Coverage and false-accept rate of the gate at one threshold, with Wilson intervals."""

    threshold: float
    n: int
    accepted: int
    wrong: int
    coverage: float
    coverage_ci: tuple[float, float]
    false_accept: float
    """NaN when nothing is accepted (r undefined)."""
    false_accept_ci: tuple[float, float]

    def as_dict(self) -> dict:
        return asdict(self)


def gate_point(pairs: Sequence[GatePair], threshold: float, confidence: float = 0.95) -> GatePoint:
    """c(τ) and r(τ) at one τ (Eqs. 13-14)."""
    if not pairs:
        raise ValueError("no (logit gap, correct) pairs to calibrate on")
    gaps = np.array([p.logit_gap for p in pairs], dtype=float)
    if np.isnan(gaps).any():
        raise ValueError("a logit gap is NaN")
    admissible = np.array([p.in_answer_set for p in pairs], dtype=bool)
    correct = np.array([p.correct for p in pairs], dtype=bool)
    accepted = (gaps > threshold) & admissible
    n, k = len(pairs), int(accepted.sum())
    wrong = int((accepted & ~correct).sum())
    return GatePoint(
        threshold=float(threshold), n=n, accepted=k, wrong=wrong, coverage=k / n,
        coverage_ci=wilson_interval(k, n, confidence), false_accept=wrong / k if k else math.nan,
        false_accept_ci=wilson_interval(wrong, k, confidence),
    )


def gap_quantiles(gaps: Sequence[float], qs: Sequence[float] = (0.1, 0.5, 0.9)) -> list[float]:
    """Linear-interpolation quantiles of γ (numpy's default), right where a gap is +inf (the runner-up is
    impossible): numpy's interpolation gives NaN next to an inf (inf·0, inf − inf), so infs are clipped to
    the largest float, and a quantile beyond every finite gap (it interpolated towards an inf) is inf."""
    g = np.asarray(gaps, dtype=float)
    if g.size == 0 or np.isnan(g).any() or (g == -np.inf).any():
        raise ValueError("gap quantiles need at least one gap, none NaN or -inf")
    finite = g[np.isfinite(g)]
    q = np.quantile(np.minimum(g, np.finfo(float).max), qs)
    top = finite.max() if finite.size else -np.inf
    return [math.inf if x > top else float(x) for x in q]


def default_thresholds(pairs: Sequence[GatePair], extra: Sequence[float] = (0.0, 2.0)) -> list[float]:
    """Every distinct operating point: just below each measured gap (plus `extra`, e.g. the paper's 2.0).
    Never below 0, the gate's domain (GateConfig rejects τ < 0): a tie γ = 0 is accepted at no τ."""
    gaps = sorted({float(p.logit_gap) for p in pairs})
    taus = {max(float(np.nextafter(g, -np.inf)), 0.0) for g in gaps} | {float(x) for x in extra}
    if gaps:
        taus.add(gaps[-1])  # nothing accepted beyond the largest gap
    return sorted(float(t) for t in taus)


def sweep_threshold(pairs: Sequence[GatePair], thresholds: Sequence[float] | None = None,
                    confidence: float = 0.95) -> list[GatePoint]:
    """The risk-coverage sweep: one GatePoint per τ, ascending τ."""
    taus = sorted(default_thresholds(pairs) if thresholds is None else thresholds)
    return [gate_point(pairs, t, confidence) for t in taus]


def pick_threshold(points: Sequence[GatePoint], r_max: float) -> GatePoint | None:
    """The smallest τ with r(τ) ≤ r_max (maximum coverage at bounded risk); None if no τ qualifies."""
    if not 0 <= r_max <= 1:
        raise ValueError(f"r_max must be in [0, 1], got {r_max}")
    for p in sorted(points, key=lambda q: q.threshold):
        if p.accepted > 0 and p.false_accept <= r_max:
            return p
    return None


@dataclass(frozen=True)
class HeldOutCalibration:
    """τ picked on calibration decision points, judged on held-out ones (Wilson intervals throughout)."""

    r_max: float
    tau: float
    """The reference τ (the paper's 2.0), also reported on the held-out points."""
    calibrated: GatePoint | None
    """The smallest τ with r(τ) ≤ r_max on the calibration points (None: no τ qualifies)."""
    held_out_at_calibrated: GatePoint | None
    """That τ applied to the held-out points (the honest estimate of its coverage and risk)."""
    held_out_at_tau: GatePoint

    @property
    def auto_tau(self) -> float:
        """τ for `--tau auto`: the calibrated one, or inf (the gate never fires) when none qualifies."""
        return math.inf if self.calibrated is None else self.calibrated.threshold

    def as_dict(self) -> dict:
        out = asdict(self)
        out["auto_tau"] = self.auto_tau
        return out


def calibrate_held_out(calib: Sequence[GatePair], held_out: Sequence[GatePair], *, r_max: float,
                       tau: float = 2.0) -> HeldOutCalibration:
    """Pick τ on `calib` (smallest τ with r ≤ r_max), then measure it, and the reference τ, on `held_out`."""
    chosen = pick_threshold(sweep_threshold(calib), r_max)
    return HeldOutCalibration(
        r_max=r_max, tau=float(tau), calibrated=chosen,
        held_out_at_calibrated=None if chosen is None else gate_point(held_out, chosen.threshold),
        held_out_at_tau=gate_point(held_out, tau),
    )


def plot_risk_coverage(points: Sequence[GatePoint], path: str, *, title: str = "", tau_marker: float = 2.0) -> str:
    """Figure 7: (a) r(τ) against c(τ); (b) c(τ) and r(τ) against τ, with Wilson bands.  Returns `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted(points, key=lambda q: q.threshold)
    tau = np.array([p.threshold for p in pts])
    cov = np.array([p.coverage for p in pts])
    risk = np.array([p.false_accept for p in pts])
    cov_lo, cov_hi = np.array([p.coverage_ci for p in pts]).T
    r_lo, r_hi = np.array([p.false_accept_ci for p in pts]).T
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ok = ~np.isnan(risk)
    ax1.plot(cov[ok], risk[ok], "o-", ms=3)
    ax1.set_xlabel("coverage c(τ)")
    ax1.set_ylabel("false-accept rate r(τ)")
    ax1.set_title("(a) risk-coverage")
    if not ok.any():
        ax1.text(0.5, 0.5, "the gate accepts no decision point at any τ", ha="center", va="center",
                 transform=ax1.transAxes)
    ax1.set_xlim(-0.02, 1.02)
    ax2.plot(tau, cov, label="coverage c(τ)")
    ax2.fill_between(tau, cov_lo, cov_hi, alpha=0.2)
    ax2.plot(tau[ok], risk[ok], label="false accept r(τ)")
    ax2.fill_between(tau[ok], r_lo[ok], r_hi[ok], alpha=0.2)
    ax2.axvline(tau_marker, color="k", ls="--", lw=0.8, label=f"τ = {tau_marker:g}")
    ax2.set_xlabel("threshold τ")
    ax2.set_title("(b) coverage and false accept vs τ")
    ax2.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def first_token_labels(tokenizer: Any, words: Mapping[str, Sequence[str]]) -> dict[int, str]:
    """A, the fast-answer set of a task: the first token of each answer word (with and without a leading
    space) -> its label.  A first token that starts words of two labels is ambiguous and left out."""
    claims: dict[int, set[str]] = {}
    for label, variants in words.items():
        for w in variants:
            for variant in (w, " " + w):
                ids = tokenizer.encode(variant, add_special_tokens=False)
                if ids:
                    claims.setdefault(int(ids[0]), set()).add(label)
    return {t: next(iter(lbl)) for t, lbl in claims.items() if len(lbl) == 1}
