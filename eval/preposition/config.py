"""The sizes of one `forerun bench preposition` run (`BenchConfig`): frozen, validated, the CLI's defaults."""

from __future__ import annotations

from dataclasses import dataclass

from ...runtime_ext.preposition.gate import GateConfig


MAX_TRACE_INTERVAL_S = 3600.0
"""The longest mean update interval of a live trace: it is replayed in real time (an interval of 1e308 s
overflowed the sleep between updates: an internal error)."""


def check_trace_interval(interval_s: float, what: str) -> float:
    """`interval_s`, or a ValueError when the trace could not be replayed in real time."""
    if not interval_s <= MAX_TRACE_INTERVAL_S:
        raise ValueError(f"{what}: a mean update interval of {interval_s:g} s is over {MAX_TRACE_INTERVAL_S:g} s; "
                         "the live trace is replayed in real time")
    return interval_s


MAX_TRACE_QUERIES = 100_000
"""Most queries one live trace may be asked to serve (ρ × updates, expected): each is a real request replayed in
real time, so more is hours of work, and ρ near 1e19 overflowed numpy's Poisson draw after the rest of the bench
had run ("lam value too large")."""


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of one `bench preposition` run (CPU-sized defaults: about 4-5 minutes on 2 cores)."""

    requests: int = 128
    """Requests per latency arm (paper: 128 fast-path fires, 144 cold observations)."""
    trace_updates: int = 32
    """Updates per ρ in the live trace (paper: 128 pre-positions per point; CPU-sized default 32)."""
    rhos: tuple[float, ...] = (0.25, 1.0, 4.0)
    """Query-to-update ratios ρ = λ_q / λ_u of the live trace."""
    trace_interval_s: float | None = None
    """Mean update interval of the trace (1/λ_u) in seconds; None: `trace_idle_factor` × (ingest + T_pp) of one
    update on the trace's own session (`live_trace.status_update_cost`)."""
    trace_idle_factor: float = 4.0
    """Mean update interval as a multiple of the measured ingest + pre-position time (Eq. 7 needs it ≫ 1)."""
    calib_windows: int = 64
    """Trend windows for the paper-task gate report (paper: 128 decision points; CPU-sized default 64): 0 skips,
    else at least 2, split into calibration and held-out halves (`trend_task.SPLIT`)."""
    status_windows: int = 64
    """Status-feed windows to calibrate τ on, and as many (other seeds) held out to judge it."""
    tau: float | str = 2.0
    """τ of the live traces (paper default 2.0), or "auto": the status calibration's τ for r_max."""
    r_max: float = 0.05
    """Risk budget for the calibrated τ."""
    agentic_turns: int = 24
    """Tool calls in the agentic trace (0 skips)."""
    energy_iterations: int = 16
    """Updates per energy loop (with / without pre-position); skipped where no energy counter exists."""
    energy_idle_s: float = 3.0
    """Seconds of idle power measured before the energy loops."""
    prefill_lengths: tuple[int, ...] = (16, 32, 64, 128)
    """Unique prompt lengths for the τ_p slope."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if min(self.trace_updates, self.calib_windows, self.status_windows, self.agentic_turns,
               self.energy_iterations) < 0:
            raise ValueError("trace_updates, calib_windows, status_windows, agentic_turns and energy_iterations "
                             "must be >= 0")
        if self.calib_windows == 1:
            raise ValueError("calib_windows must be 0 (skip) or >= 2 (alternate windows pick τ and judge it), got 1")
        if isinstance(self.tau, str):
            if self.tau != "auto":
                raise ValueError(f'tau must be a number >= 0 or "auto", got {self.tau!r}')
            if not self.status_windows:
                raise ValueError('tau = "auto" needs the status calibration (status_windows > 0)')
        else:
            GateConfig(threshold=self.tau)  # validates τ
        if not 0 <= self.r_max <= 1:
            raise ValueError(f"r_max must be in [0, 1], got {self.r_max}")
        if self.energy_idle_s <= 0:
            raise ValueError(f"energy_idle_s must be > 0, got {self.energy_idle_s}")
        if any(r <= 0 for r in self.rhos):
            raise ValueError(f"rhos must be > 0, got {self.rhos}")
        queries = max(self.rhos) * self.trace_updates
        if queries > MAX_TRACE_QUERIES:
            about = f"about {queries:.3g}" if queries < float("inf") else "more than 1e308"
            raise ValueError(f"rhos: ρ = {max(self.rhos):g} with trace_updates = {self.trace_updates} asks the live trace "
                             f"to serve {about} queries in real time; at most {MAX_TRACE_QUERIES} (ρ × trace_updates)")
        if self.trace_idle_factor <= 0:
            raise ValueError(f"trace_idle_factor must be > 0, got {self.trace_idle_factor}")
        if self.trace_interval_s is not None and self.trace_interval_s <= 0:
            raise ValueError(f"trace_interval_s must be > 0, got {self.trace_interval_s}")
        if self.trace_interval_s is not None:
            check_trace_interval(self.trace_interval_s, "trace_interval_s")
        if len(self.prefill_lengths) < 2 or min(self.prefill_lengths) < 1:
            raise ValueError("prefill_lengths needs at least two lengths >= 1")
