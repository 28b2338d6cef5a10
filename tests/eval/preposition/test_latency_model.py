"""Closed-form latency model (Eqs. 2-10), the Poisson trace, and a live-trace hit rate vs ρ/(1+ρ)."""

from __future__ import annotations

import numpy as np
import pytest

from forerun.eval.preposition.calibration import wilson_interval
from forerun.eval.preposition.latency_model import (
    PAPER_CONSTANTS,
    LatencyConstants,
    amortized,
    expected_latency,
    hit_rate,
    l_cold,
    l_fall,
    l_fast,
    net_benefit,
    plot_amortization,
    plot_cost_anatomy,
    plot_latency_vs_entry,
    poisson_trace,
    preposition_cost,
    replay_trace,
    speedup,
    wasted_fraction,
)
from forerun.runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
from forerun.runtime_ext.protocol import GenerateOutput
from forerun.runtime_ext.preposition.ready_cache import SessionState
from forerun.runtime_ext.preposition.gate import GateConfig

C = LatencyConstants(prefill_ms_per_token=2.0, decode_ms=10.0, scan_ms=0.5, restore_ms=1.0)


def test_equations():
    assert l_cold(18, C) == 46.0 and l_fast(C) == 0.5 and speedup(18, C) == 92.0
    assert l_fall(0, C) == 11.0 and l_fall(18, C) == l_cold(18, C) + C.restore_ms  # Eq. 5 endpoints
    assert preposition_cost(18, C) == 36.0 and amortized(18, 36.0, C) and not amortized(18, 35.9, C)
    assert np.allclose(l_cold(np.array([1, 2]), C), [12.0, 14.0])
    # S grows with the entry length (Figure 4b)
    assert np.all(np.diff(speedup(np.arange(1, 100), C)) > 0)


def test_paper_table_values():
    # L_cold at an 18-token entry from Table 1: 0.843*18 + 39.12 = 54.3 ms (measured 53.1)
    assert l_cold(18, PAPER_CONSTANTS) == pytest.approx(54.294)
    assert l_fall(0, PAPER_CONSTANTS) == pytest.approx(53.59)


def test_hit_rate_and_expected_latency():
    assert hit_rate(1.0) == 0.5 and hit_rate(4.0) == 0.8 and wasted_fraction(0.8) == pytest.approx(0.2)
    cold, fall, fast = 50.0, 40.0, 1.0
    assert expected_latency(0.0, 0.9, fast, fall, cold) == cold
    assert expected_latency(1.0, 1.0, fast, fall, cold) == fast
    h = hit_rate(np.logspace(-2, 2, 50))
    e = expected_latency(h, 0.5, fast, fall, cold)
    assert np.all(np.diff(e) < 0) and np.all(e < cold)  # Figure 6b: below L_cold for every ρ > 0
    assert net_benefit(0.5, fast, fall, cold) and not net_benefit(0.0, fast, 60.0, cold)
    # Eq. 10 iff E[L_pp] < L_cold for any h > 0 (brute force over a grid)
    rng = np.random.default_rng(0)
    for _ in range(200):
        g, fa, fl, co = rng.uniform(0, 1), *rng.uniform(0, 100, 3)
        assert net_benefit(g, fa, fl, co) == (expected_latency(0.3, g, fa, fl, co) < co)
    with pytest.raises(ValueError, match="g"):
        expected_latency(0.5, 1.5, fast, fall, cold)


def test_bad_constants_rejected():
    with pytest.raises(ValueError, match="decode_ms"):
        LatencyConstants(prefill_ms_per_token=1.0, decode_ms=-1.0, scan_ms=1.0)
    with pytest.raises(ValueError, match="rho"):
        hit_rate(-1.0)


def test_poisson_trace_shape():
    ev = poisson_trace(4.0, 500, np.random.default_rng(0))
    assert ev[0] == (0.0, "update") and sum(k == "update" for _, k in ev) == 501
    n_q = sum(k == "query" for _, k in ev)
    assert 4 * 500 * 0.85 < n_q < 4 * 500 * 1.15
    assert all(a[0] <= b[0] for a, b in zip(ev, ev[1:]))


class ConstantEngine:
    tokenizer = None

    def generate(self, input_ids, params, *, rid=None, priority=0):
        meta = {"output_top_logprobs": [[[-0.1, 1, None], [-5.0, 2, None]]]}
        return GenerateOutput(tuple(input_ids), (1,), "", meta)


@pytest.mark.parametrize("rho", [0.25, 1.0, 4.0])
def test_live_trace_hit_rate_tracks_closed_form(rho):
    """Event-ordered replay (each pre-position completes inside its idle window, Eq. 7)."""
    pp = Prepositioner(ConstantEngine(), PrepositionConfig(gate=GateConfig(threshold=0.0), background=False))
    s = SessionState([0])
    events = poisson_trace(rho, 400, np.random.default_rng(int(rho * 100)))

    def update():
        s.append([3])
        pp.preposition(s, [4])

    replay_trace(events, update, lambda: pp.serve(s, [4]), seconds_per_unit=0.0)
    c = pp.counters
    lo, hi = wilson_interval(c.consumed, c.consumed + c.invalidated + c.discarded, 0.999)
    assert lo <= hit_rate(rho) <= hi, (c.hit_rate, hit_rate(rho))


def test_plots(tmp_path):
    plot_latency_vs_entry(C, str(tmp_path / "f4.png"), measured_entry=18, measured_cold=[(18, 40.0)])
    plot_cost_anatomy(C, 18, str(tmp_path / "f5.png"), measured=[50.0, 12.0, 52.0, 0.4])
    with pytest.raises(ValueError, match="four"):
        plot_cost_anatomy(C, 18, str(tmp_path / "f5b.png"), measured=[1.0])
    plot_amortization(C, 18, 0.9, str(tmp_path / "f6.png"), measured=[(1.0, 0.48, 0.4, 0.56)])
    # g not measured (bench without the status calibration): no g·h curve, E[L_pp] shaded over g in [0, 1]
    plot_amortization(C, 18, None, str(tmp_path / "f6_unmeasured.png"), measured=[(1.0, 0.48, 0.4, 0.56)],
                      measured_fast=[(1.0, 0.2, 0.1, 0.3)])
    assert (tmp_path / "f6_unmeasured.png").stat().st_size > 1000
    for f in ("f4", "f5", "f6"):
        assert (tmp_path / f"{f}.png").stat().st_size > 1000


def test_hit_rate_delayed_matches_monte_carlo():
    from forerun.eval.preposition.latency_model import hit_rate_delayed

    rng = np.random.default_rng(5)
    for rho, d in [(1.0, 0.0), (1.0, 0.25), (4.0, 0.5), (0.25, 0.1)]:
        w = rng.exponential(1.0, 200_000)
        first_query_after_install = d + rng.exponential(1 / rho, w.size)
        mc = np.mean((w > d) & (first_query_after_install < w))
        assert mc == pytest.approx(hit_rate_delayed(rho, d), abs=0.005)
    assert hit_rate_delayed(1.0, 0.0) == hit_rate(1.0)
    with pytest.raises(ValueError, match="delay"):
        hit_rate_delayed(1.0, -1.0)


def test_replay_trace_final_lag_is_the_last_events():
    """A late event early in the trace does not stick: the last event fired on time, so the lag is ~0."""
    import time

    def slow():
        time.sleep(0.05)

    events = [(0.0, "update"), (0.0, "query"), (10.0, "update")]  # the query runs 50 ms late; the last is on time
    calls = iter([slow, lambda: None])
    lag = replay_trace(events, lambda: next(calls, lambda: None)(), lambda: None, seconds_per_unit=0.02)
    assert lag < 0.02
    # and a trace that ends late reports that lag
    assert replay_trace([(0.0, "update"), (0.0, "query")], slow, lambda: None, 1.0) >= 0.04
