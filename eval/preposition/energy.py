"""Energy per pre-position (pre-positioning paper §6, HW-6): package energy from RAPL or board energy from NVML.

A pre-position is wall-clock-free under Eq. 7 but not free: it draws energy, and the wasted fraction
w = 1 − h of Eq. 8 of it buys nothing.  This module reads a cumulative energy counter where the machine
has one:

* RAPL through Linux powercap: `/sys/class/powercap/intel-rapl:N/energy_uj` for each package domain
  (`name` = `package-N`), wrapping at `max_energy_range_uj`;
* NVML: `nvmlDeviceGetTotalEnergyConsumption` (millijoules since the driver loaded) of every GPU, through
  `libnvidia-ml.so.1` with ctypes (no Python package needed).

Otherwise `detect_meter` says why it is unavailable, and the benchmark reports that instead of a number.

    paper                                   code
    E_pp (marginal energy per pre-position) preposition_energy(...)["joules_per_preposition"]
    idle power                              ["idle_watts"]
    wasted energy at ρ: E_pp (1 − h(ρ))     wasted_energy(E_pp, h, interval_s)
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

POWERCAP = Path("/sys/class/powercap")
NVML_LIBRARY = "libnvidia-ml.so.1"


@dataclass
class RaplMeter:
    """Sum of the RAPL package domains' energy counters, in joules, with wrap-around handled."""

    domains: list[Path]
    source: str = "RAPL package energy (powercap)"

    def __post_init__(self) -> None:
        self._last = [self._raw(d) for d in self.domains]
        self._total = 0.0

    @staticmethod
    def _raw(domain: Path) -> int:
        return int((domain / "energy_uj").read_text().strip())

    def joules(self) -> float:
        for i, d in enumerate(self.domains):
            now = self._raw(d)
            step = now - self._last[i]
            if step < 0:  # the counter wrapped
                step += int((d / "max_energy_range_uj").read_text().strip())
            self._total += step / 1e6
            self._last[i] = now
        return self._total


@dataclass
class NvmlMeter:
    """Sum over the GPUs of NVML's total energy counter, in joules."""

    lib: ctypes.CDLL
    handles: list[ctypes.c_void_p]
    source: str = "NVML board energy"

    def joules(self) -> float:
        total = 0
        for h in self.handles:
            mj = ctypes.c_ulonglong()
            if self.lib.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(mj)) != 0:
                raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed")
            total += mj.value
        return total / 1e3


@dataclass(frozen=True)
class Unavailable:
    """No energy counter on this machine, and why."""

    reason: str


def rapl_domains(root: Path = POWERCAP) -> list[Path]:
    """The readable RAPL package domains under `root` (sub-domains such as core or dram are left out)."""
    out = []
    for d in sorted(root.glob("intel-rapl:*")) if root.is_dir() else []:
        name = (d / "name").read_text().strip() if (d / "name").exists() else ""
        if d.name.count(":") == 1 and name.startswith("package") and (d / "energy_uj").exists():
            try:
                int((d / "energy_uj").read_text().strip())
            except (OSError, ValueError):
                continue  # present but unreadable (permissions)
            out.append(d)
    return out


def _nvml(library: str) -> NvmlMeter | str:
    try:
        lib = ctypes.CDLL(library)
    except OSError:
        return f"no NVML ({library} not found)"
    if lib.nvmlInit_v2() != 0:
        return "NVML present but nvmlInit failed"
    count = ctypes.c_uint()
    if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0 or count.value == 0:
        return "NVML present but no GPU"
    handles = []
    for i in range(count.value):
        h = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) != 0:
            return f"NVML present but GPU {i} has no handle"
        handles.append(h)
    meter = NvmlMeter(lib, handles)
    try:
        meter.joules()
    except RuntimeError:
        return "NVML present but its energy counter is not supported on this GPU"
    return meter


def detect_meter(root: Path = POWERCAP, nvml_library: str = NVML_LIBRARY) -> RaplMeter | NvmlMeter | Unavailable:
    """NVML when a GPU reports energy, else RAPL package domains, else Unavailable with the reason."""
    nvml = _nvml(nvml_library)
    if not isinstance(nvml, str):
        return nvml
    domains = rapl_domains(root)
    if domains:
        return RaplMeter(domains)
    rapl = (f"no readable RAPL package domain ({root}/intel-rapl:*/energy_uj)" if root.is_dir()
            else f"no powercap ({root} absent)")
    return Unavailable(f"energy unavailable on this machine: {rapl}; {nvml}")


def preposition_energy(meter: RaplMeter | NvmlMeter, with_preposition: Callable[[], None],
                       ingest_only: Callable[[], None], n: int, *, idle_s: float = 3.0,
                       clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep
                       ) -> dict[str, float]:
    """Marginal energy of one pre-position (HW-6).

    Measures idle power over `idle_s`, then `n` iterations of `with_preposition` (an update, its
    pre-position, waiting for it) and `n` of `ingest_only` (the same update without it); each loop's
    energy above idle, and their difference per iteration, is E_pp.
    """
    if n < 1 or idle_s <= 0:
        raise ValueError(f"need n >= 1 and idle_s > 0, got {n}, {idle_s}")
    e0, t0 = meter.joules(), clock()
    sleep(idle_s)
    idle_w = (meter.joules() - e0) / (clock() - t0)

    def above_idle(step: Callable[[], None]) -> tuple[float, float]:
        e, t = meter.joules(), clock()
        for _ in range(n):
            step()
        dt = clock() - t
        return meter.joules() - e - idle_w * dt, dt

    e_pp, t_pp = above_idle(with_preposition)
    e_in, t_in = above_idle(ingest_only)
    return {"idle_watts": idle_w, "loop_watts": idle_w + e_pp / t_pp, "joules_per_preposition": (e_pp - e_in) / n,
            "joules_per_update_with": e_pp / n, "joules_per_update_ingest_only": e_in / n, "iterations": n}


def wasted_energy(joules_per_preposition: float, h: float | Sequence[float], interval_s: float) -> dict[str, list[float]]:
    """Wasted energy per update E_pp (1 − h) and the wasted power E_pp (1 − h) / interval at each h."""
    hs = [float(h)] if isinstance(h, (int, float)) else [float(x) for x in h]
    per_update = [joules_per_preposition * (1.0 - x) for x in hs]
    return {"joules_per_update": per_update, "watts": [j / interval_s for j in per_update]}
