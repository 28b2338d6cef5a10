"""Energy per pre-position: RAPL through a fake powercap tree, detection, the marginal-energy arithmetic."""

from __future__ import annotations

import pytest

from forerun.eval.preposition.energy import (
    RaplMeter,
    Unavailable,
    detect_meter,
    preposition_energy,
    rapl_domains,
    wasted_energy,
)


def _domain(root, name, label, uj, max_uj=1_000_000_000):
    d = root / name
    d.mkdir()
    (d / "name").write_text(label + "\n")
    (d / "energy_uj").write_text(f"{uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


def test_rapl_sums_package_domains_and_handles_wraparound(tmp_path):
    p0 = _domain(tmp_path, "intel-rapl:0", "package-0", 999_000_000)
    p1 = _domain(tmp_path, "intel-rapl:1", "package-1", 5_000_000)
    _domain(tmp_path, "intel-rapl:0:0", "core", 1)  # a sub-domain: already inside package-0
    assert rapl_domains(tmp_path) == [p0, p1]
    meter = detect_meter(tmp_path, nvml_library="libforerun-no-such-nvml.so")
    assert isinstance(meter, RaplMeter) and meter.joules() == 0.0
    (p0 / "energy_uj").write_text("1000000\n")  # wrapped: 999 J -> 1000 J (max) -> 1 J
    (p1 / "energy_uj").write_text("7000000\n")
    assert meter.joules() == pytest.approx(2.0 + 2.0)


def test_unavailable_says_why(tmp_path):
    got = detect_meter(tmp_path / "absent", nvml_library="libforerun-no-such-nvml.so")
    assert isinstance(got, Unavailable)
    assert "unavailable on this machine" in got.reason and "no powercap" in got.reason and "no NVML" in got.reason
    (tmp_path / "intel-rapl:0").mkdir()  # present but without a readable counter
    assert "no readable RAPL" in detect_meter(tmp_path, nvml_library="libforerun-no-such-nvml.so").reason


def test_marginal_energy_per_preposition():
    """Idle 10 W; an update costs 1 s and 2 J above idle, a pre-position 0.5 s and 3 J more."""
    state = {"t": 0.0, "j": 0.0}

    class Meter:
        source = "fake"

        def joules(self):
            return state["j"]

    def run(seconds, above_idle):
        state["t"] += seconds
        state["j"] += 10.0 * seconds + above_idle

    res = preposition_energy(Meter(), lambda: run(1.5, 5.0), lambda: run(1.0, 2.0), 4, idle_s=2.0,
                             clock=lambda: state["t"], sleep=lambda s: run(s, 0.0))
    assert res["idle_watts"] == pytest.approx(10.0)
    assert res["joules_per_preposition"] == pytest.approx(3.0)
    assert res["joules_per_update_with"] == pytest.approx(5.0) and res["loop_watts"] == pytest.approx(10 + 5 / 1.5)
    w = wasted_energy(3.0, [0.2, 0.5], interval_s=2.0)
    assert w["joules_per_update"] == pytest.approx([2.4, 1.5]) and w["watts"] == pytest.approx([1.2, 0.75])
    with pytest.raises(ValueError):
        preposition_energy(Meter(), lambda: None, lambda: None, 0)


def test_this_machine_reports_a_meter_or_a_reason():
    got = detect_meter()
    assert isinstance(got, Unavailable) and got.reason or got.joules() >= 0
