"""`bench preposition`'s gate-fire probability g: measured on held-out status windows, or marked unmeasured."""

from __future__ import annotations

from forerun.eval.preposition.bench import _live_tau
from forerun.eval.preposition.config import BenchConfig
from forerun.eval.preposition.status_task import StatusPair


def test_g_is_the_held_out_coverage_at_the_live_tau():
    held = [StatusPair("up", gap, 0, 0.0, 0, 0, label, None)
            for gap, label in [(3.0, "up"), (2.5, "down"), (1.0, "up"), (4.0, None), (2.1, "up")]]
    tau, g, source = _live_tau(BenchConfig(tau=2.0), {"held": held, "exact": None})
    assert tau == 2.0 and g == 3 / 5  # 3.0, 2.5 and 2.1 clear τ in A (4.0 is outside A), whatever their label
    assert "5 held-out status-feed windows" in source


def test_g_without_the_status_calibration_is_unmeasured_not_zero():
    tau, g, source = _live_tau(BenchConfig(tau=1.5, status_windows=0), None)
    assert tau == 1.5 and g is None and "not measured" in source and "status_windows = 0" in source
