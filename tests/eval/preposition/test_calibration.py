"""Gate calibration sweep: Eq. 13/14 against brute force, τ choice."""

from __future__ import annotations

import math

import numpy as np
import pytest

from forerun.eval.preposition.calibration import (
    GatePair,
    calibrate_held_out,
    default_thresholds,
    gate_point,
    pick_threshold,
    plot_risk_coverage,
    sweep_threshold,
)


def _pairs(seed=0, n=300):
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(2.0, n)
    return [GatePair(float(g), bool(rng.random() < 0.8), bool(rng.random() < 1 - 0.4 * np.exp(-g))) for g in gaps]


def test_sweep_matches_brute_force_and_is_monotone_in_coverage():
    pairs = _pairs()
    points = sweep_threshold(pairs)
    covs = [p.coverage for p in points]
    assert all(a >= b for a, b in zip(covs, covs[1:]))  # c(τ) non-increasing
    for p in points[:: max(1, len(points) // 25)]:
        acc = [q for q in pairs if q.logit_gap > p.threshold and q.in_answer_set]
        assert p.accepted == len(acc) and p.coverage == len(acc) / len(pairs)
        if acc:
            assert p.false_accept == pytest.approx(sum(not q.correct for q in acc) / len(acc))
        else:
            assert math.isnan(p.false_accept)
    assert points[-1].accepted == 0
    assert max(covs) == pytest.approx(sum(q.in_answer_set for q in pairs) / len(pairs))
    assert any(p.threshold == 2.0 for p in points)


def test_pick_threshold_is_smallest_tau_within_budget():
    pairs = _pairs(1)
    points = sweep_threshold(pairs)
    r_max = 0.1
    best = pick_threshold(points, r_max)
    assert best is not None and best.false_accept <= r_max
    assert all(not (p.accepted and p.false_accept <= r_max) for p in points if p.threshold < best.threshold)
    assert pick_threshold(points, 0.0) is None or pick_threshold(points, 0.0).wrong == 0
    assert pick_threshold([gate_point([GatePair(0.1, True, False)], 0.0)], 0.5) is None
    with pytest.raises(ValueError, match="r_max"):
        pick_threshold(points, 1.5)


def test_bad_pairs_rejected():
    with pytest.raises(ValueError, match="no"):
        gate_point([], 1.0)
    with pytest.raises(ValueError, match="NaN"):
        gate_point([GatePair(float("nan"), True, True)], 1.0)


def test_plot_writes_png(tmp_path):
    out = plot_risk_coverage(sweep_threshold(_pairs(2, 60)), str(tmp_path / "fig7.png"))
    assert (tmp_path / "fig7.png").stat().st_size > 1000 and out.endswith("fig7.png")


def test_calibrate_held_out_picks_on_one_set_and_judges_on_the_other():
    from forerun.eval.preposition.calibration import calibrate_held_out

    calib = [GatePair(g, True, g > 1.0) for g in np.linspace(0.05, 4.0, 40)]  # wrong below γ = 1
    held = [GatePair(g, True, g > 1.5) for g in np.linspace(0.05, 4.0, 40)]  # the held-out set is harsher
    res = calibrate_held_out(calib, held, r_max=0.0, tau=2.0)
    assert res.calibrated.false_accept == 0.0 and 0.96 < res.calibrated.threshold < 1.07  # just below the first right γ
    assert res.auto_tau == res.calibrated.threshold
    brute = [p for p in held if p.logit_gap > res.auto_tau]
    assert res.held_out_at_calibrated.accepted == len(brute)
    assert res.held_out_at_calibrated.wrong == sum(not p.correct for p in brute) > 0  # the honest estimate
    assert res.held_out_at_tau.threshold == 2.0 and res.held_out_at_tau.wrong == 0
    never = calibrate_held_out([GatePair(1.0, True, False)], held, r_max=0.0)
    assert never.calibrated is None and never.auto_tau == math.inf and never.held_out_at_calibrated is None
    assert set(res.as_dict()) >= {"auto_tau", "held_out_at_calibrated", "calibrated"}


def test_gap_quantiles_with_an_infinite_gap():
    """γ = +inf (runner-up impossible) is a valid gap: numpy's quantile gives NaN beside it; ours does not."""
    from forerun.eval.preposition.calibration import gap_quantiles

    finite = [0.3, 1.0, 2.5, 4.0, 7.5]
    assert np.allclose(gap_quantiles(finite), np.quantile(finite, [0.1, 0.5, 0.9]))  # numpy's on finite gaps
    assert gap_quantiles([1.0, 2.0, np.inf]) == [1.2, 2.0, np.inf]  # median exact; 0.9 lies between 2 and inf
    assert gap_quantiles([np.inf, np.inf]) == [np.inf] * 3
    assert gap_quantiles([5.0, np.inf], [0.0, 1.0]) == [5.0, np.inf]
    with pytest.raises(ValueError):
        gap_quantiles([1.0, np.nan])


def test_trend_report_quantiles_with_an_infinite_gap():
    from forerun.eval.preposition.trend_task import TrendPair, report

    pairs = [TrendPair(g, 1, True, 1, "up", "up", "up") for g in (1.0, 2.0, np.inf)]
    rep, _ = report(pairs, tau=2.0, r_max=0.1)
    assert rep.gap_quantiles == pytest.approx((1.2, 2.0, np.inf))


def test_tied_top_two_gap_gives_a_valid_tau():
    """γ = 0 (the top two logits tie, common in bf16) is accepted at no τ >= 0: the sweep stays in the
    gate's domain, so `--tau auto` is a τ GateConfig takes and its coverage is what the gate can serve."""
    from forerun.runtime_ext.preposition.gate import GateConfig

    calib = [GatePair(0.0, True, True), GatePair(3.0, True, True), GatePair(1.0, True, True)]
    assert min(default_thresholds(calib)) >= 0
    cal = calibrate_held_out(calib, calib, r_max=0.05)
    assert cal.auto_tau >= 0 and GateConfig(threshold=cal.auto_tau).threshold == cal.auto_tau
    assert cal.calibrated.accepted == 2 and cal.held_out_at_calibrated.coverage == pytest.approx(2 / 3)
