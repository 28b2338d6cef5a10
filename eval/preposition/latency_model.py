"""Closed-form latency model of pre-positioning (paper §2.2-2.3, Eqs. 2-10) and its live-trace check.

Fed by measured constants (`LatencyConstants`, from `forerun bench preposition`), it draws Figures 4-6:
critical-path latency and speedup against the entry length, the cost anatomy of the three paths, and the
hit rate / expected latency against the query-to-update ratio ρ with the measured live-trace hit rate
overlaid.  The live trace (`poisson_trace`, `replay_trace`) drives a real session with Poisson updates
(rate λ_u) and queries (rate λ_q = ρ λ_u); its hit rate is read from the session's counters.

    paper                                   code
    τ_p (prefill cost per token)            LatencyConstants.prefill_ms_per_token
    T_prefill(k) = τ_p k                    prefill_ms
    T_decode, T_scan(V), T_restore          LatencyConstants.decode_ms, .scan_ms, .restore_ms
    L_cold = T_prefill(L_entry) + T_decode  l_cold              (Eq. 2)
    L_fast = T_scan(V)                      l_fast              (Eq. 3)
    S = L_cold / L_fast                     speedup             (Eq. 4)
    L_fall = T_restore + T_prefill(Δ) + T_decode   l_fall      (Eq. 5)
    T_pp = T_prefill(L_entry)               preposition_cost    (Eq. 6)
    T_pp ≤ I_idle                           amortized           (Eq. 7)
    h = ρ/(1+ρ), w = 1 − h                  hit_rate, wasted_fraction (Eq. 8, Figure 6)
    h with T_pp-long install delay d        hit_rate_delayed = e^{−λ_u d} ρ/(1+ρ)
    E[L_pp]                                 expected_latency    (Eq. 9)
    g L_fast + (1−g) L_fall < L_cold        net_benefit         (Eq. 10)
    ρ = λ_q / λ_u                           rho
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class LatencyConstants:
    """Measured constants of one engine and model (milliseconds)."""

    prefill_ms_per_token: float
    """τ_p: slope of prefill time against unique (cache-defeating) prompt length."""
    decode_ms: float
    """T_decode: one generated token."""
    scan_ms: float
    """T_scan(V): the fast path's vocabulary scan (we use the measured L_fast P50)."""
    restore_ms: float = 0.0
    """T_restore: constant-time state restore (residual L_fall(Δ=0) − T_decode, clipped at 0)."""

    def __post_init__(self) -> None:
        for name in ("prefill_ms_per_token", "decode_ms", "scan_ms", "restore_ms"):
            v = getattr(self, name)
            if not np.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {v}")

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


PAPER_CONSTANTS = LatencyConstants(prefill_ms_per_token=0.843, decode_ms=39.12, scan_ms=0.664, restore_ms=14.47)
"""Table 1 (single H100, 70B-class model at 4 bit), for comparison plots only."""


def prefill_ms(k: float | np.ndarray, c: LatencyConstants) -> float | np.ndarray:
    """T_prefill(k) = τ_p · k."""
    return c.prefill_ms_per_token * np.asarray(k, dtype=float) if np.ndim(k) else c.prefill_ms_per_token * float(k)


def l_cold(entry_len: float | np.ndarray, c: LatencyConstants):
    """Eq. 2: L_cold = T_prefill(L_entry) + T_decode."""
    return prefill_ms(entry_len, c) + c.decode_ms


def l_fast(c: LatencyConstants) -> float:
    """Eq. 3: L_fast = T_scan(V), independent of L_entry and n_s."""
    return c.scan_ms


def speedup(entry_len: float | np.ndarray, c: LatencyConstants):
    """Eq. 4: S = L_cold / L_fast."""
    if c.scan_ms <= 0:
        raise ValueError("scan_ms must be > 0 for the speedup")
    return l_cold(entry_len, c) / c.scan_ms


def l_fall(delta: float | np.ndarray, c: LatencyConstants):
    """Eq. 5: L_fall = T_restore + T_prefill(Δ) + T_decode (Δ ≤ L_entry)."""
    return c.restore_ms + prefill_ms(delta, c) + c.decode_ms


def preposition_cost(entry_len: float, c: LatencyConstants) -> float:
    """Eq. 6: T_pp = T_prefill(L_entry)."""
    return float(prefill_ms(entry_len, c))


def amortized(entry_len: float, idle_ms: float, c: LatencyConstants) -> bool:
    """Eq. 7: the pre-position is wall-clock-free iff T_pp ≤ I_idle."""
    return preposition_cost(entry_len, c) <= idle_ms


def hit_rate(rho: float | np.ndarray):
    """h = ρ / (1 + ρ): a pre-position is consumed iff a query (rate λ_q) precedes the next update (λ_u)."""
    r = np.asarray(rho, dtype=float)
    if np.any(r < 0):
        raise ValueError("rho must be >= 0")
    out = r / (1.0 + r)
    return float(out) if np.ndim(rho) == 0 else out


def hit_rate_delayed(rho: float | np.ndarray, delay: float):
    """h when each pre-position lands `delay` (in units of the mean update interval 1/λ_u) after its update.

    Windows W ~ Exp(λ_u); the distribution is installed at d < W (else discarded) and consumed iff a query
    (rate λ_q) arrives in (d, W).  By memorylessness, E[1{W>d}(1 − e^{−λ_q (W−d)})] = e^{−λ_u d} ρ/(1+ρ):
    the closed form of Figure 6 scaled by the probability that Eq. 7 holds for the window.  delay = 0
    recovers ρ/(1+ρ).
    """
    if delay < 0:
        raise ValueError(f"delay must be >= 0, got {delay}")
    return np.exp(-delay) * hit_rate(rho)


def wasted_fraction(h: float | np.ndarray):
    """Eq. 8: w = 1 − h."""
    return 1.0 - np.asarray(h, dtype=float) if np.ndim(h) else 1.0 - float(h)


def expected_latency(h, g: float, fast_ms: float, fall_ms: float, cold_ms: float):
    """Eq. 9: E[L_pp] = h (g L_fast + (1 − g) L_fall) + (1 − h) L_cold."""
    if not 0 <= g <= 1:
        raise ValueError(f"g (gate-fire probability) must be in [0, 1], got {g}")
    h = np.asarray(h, dtype=float)
    out = h * (g * fast_ms + (1 - g) * fall_ms) + (1 - h) * cold_ms
    return float(out) if out.ndim == 0 else out


def net_benefit(g: float, fast_ms: float, fall_ms: float, cold_ms: float) -> bool:
    """Eq. 10: pre-positioning lowers expected latency for every h > 0 iff g L_fast + (1−g) L_fall < L_cold."""
    return g * fast_ms + (1 - g) * fall_ms < cold_ms


# ----------------------------------------------------------------------------------------------------
# live trace
# ----------------------------------------------------------------------------------------------------
def poisson_trace(rho: float, n_updates: int, rng: np.random.Generator, update_rate: float = 1.0
                  ) -> list[tuple[float, str]]:
    """Merged Poisson processes: `n_updates` updates at rate λ_u and the queries (rate ρ λ_u) in between.

    Returns (time, "update" | "query") sorted by time, starting with an update at t = 0.
    """
    if rho <= 0 or n_updates < 1 or update_rate <= 0:
        raise ValueError(f"need rho > 0, n_updates >= 1, update_rate > 0; got {rho}, {n_updates}, {update_rate}")
    updates = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / update_rate, n_updates))])
    horizon = updates[-1]  # the last update only closes the window of the one before
    n_q = rng.poisson(rho * update_rate * horizon)
    queries = np.sort(rng.uniform(0.0, horizon, n_q))
    events = [(float(t), "update") for t in updates] + [(float(t), "query") for t in queries]
    return sorted(events, key=lambda e: (e[0], e[1] == "query"))


def replay_trace(events: Sequence[tuple[float, str]], on_update: Callable[[], object],
                 on_query: Callable[[], object], seconds_per_unit: float) -> float:
    """Replay a trace in real time (`seconds_per_unit` per unit of trace time); returns the lag at the end.

    Events fire at their scheduled wall time, or at once when the previous handler ran late.  The lag is
    the last event's (0 when it fired on time), not a stale one from an earlier late event.
    """
    if seconds_per_unit < 0:
        raise ValueError("seconds_per_unit must be >= 0")
    start = time.perf_counter()
    lag = 0.0
    for t, kind in events:
        due = start + t * seconds_per_unit
        now = time.perf_counter()
        lag = max(now - due, 0.0)
        if due > now:
            time.sleep(due - now)
        (on_update if kind == "update" else on_query)()
    return lag


# ----------------------------------------------------------------------------------------------------
# figures
# ----------------------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_vs_entry(c: LatencyConstants, path: str, *, max_entry: int = 256, measured_entry: int | None = None,
                          measured_cold: Sequence[tuple[int, float]] = ()) -> str:
    """Figure 4: (a) L_cold and L_fast against L_entry; (b) the speedup S."""
    plt = _plt()
    L = np.arange(1, max_entry + 1)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(L, l_cold(L, c), label="L_cold (Eq. 2)")
    a.plot(L, np.full(L.shape, l_fast(c)), label="L_fast (Eq. 3)")
    if measured_cold:
        xs, ys = zip(*measured_cold)
        a.plot(xs, ys, "ko", ms=4, label="measured cold")
    b.plot(L, speedup(L, c))
    for ax in (a, b):
        if measured_entry:
            ax.axvline(measured_entry, ls="--", color="gray", lw=0.8)
        ax.set_xlabel("entry length L_entry (tokens)")
    a.set_ylabel("ms")
    a.set_title("(a) critical-path latency")
    a.legend(fontsize=8)
    b.set_ylabel("S = L_cold / L_fast")
    b.set_title("(b) fast-path speedup (Eq. 4)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_cost_anatomy(c: LatencyConstants, entry_len: int, path: str, measured: Sequence[float] = ()) -> str:
    """Figure 5: the additive components of L_cold, L_fall(Δ=0), L_fall(Δ=L_entry) and L_fast.

    `measured` (four P50s in that order) is overlaid as black markers.
    """
    plt = _plt()
    names = ["L_cold", "L_fall(Δ=0)", "L_fall(Δ=L_entry)", "L_fast"]
    comp = {
        "restore": [0, c.restore_ms, c.restore_ms, 0],
        "prefill": [prefill_ms(entry_len, c), 0, prefill_ms(entry_len, c), 0],
        "decode": [c.decode_ms, c.decode_ms, c.decode_ms, 0],
        "scan": [0, 0, 0, c.scan_ms],
    }
    fig, ax = plt.subplots(figsize=(6, 4))
    bottom = np.zeros(4)
    for k, v in comp.items():
        ax.bar(names, v, bottom=bottom, label=k)
        bottom += np.asarray(v, dtype=float)
    if len(measured):
        if len(measured) != 4:
            raise ValueError("measured needs the four P50s: cold, fall(0), fall(L_entry), fast")
        ax.plot(names, measured, "kD", ms=6, label="measured P50")
    ax.set_ylabel("ms")
    ax.set_title(f"cost anatomy at L_entry = {entry_len}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_amortization(c: LatencyConstants, entry_len: int, g: float | None, path: str,
                      measured: Sequence[tuple[float, float, float, float]] = (),
                      measured_fast: Sequence[tuple[float, float, float, float]] = ()) -> str:
    """Figure 6: (a) h and w against ρ with measured (ρ, h, lo, hi) overlaid, and the un-forced fast-path
    hits g·h with measured (ρ, h_fast, lo, hi); (b) E[L_pp] against ρ.  g = None (not measured): no g·h
    curve, and (b) shades E[L_pp] between g = 0 and g = 1 instead of drawing one g."""
    plt = _plt()
    rho = np.logspace(-2, 2, 200)
    h = hit_rate(rho)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(rho, h, label="h = ρ/(1+ρ)")
    a.plot(rho, wasted_fraction(h), label="w = 1 − h")
    if measured:
        r, hm, lo, hi = (np.array(x, dtype=float) for x in zip(*measured))
        a.errorbar(r, hm, yerr=[hm - lo, hi - hm], fmt="ko", ms=4, capsize=3, label="measured (live trace)")
    if measured_fast:
        if g is not None:
            a.plot(rho, g * h, ls="--", label=f"g·h, fast-path hits (g = {g:.2f})")
        r, hm, lo, hi = (np.array(x, dtype=float) for x in zip(*measured_fast))
        a.errorbar(r, hm, yerr=[hm - lo, hi - hm], fmt="rs", ms=4, capsize=3, label="measured fast-path hits")
    a.set_xscale("log")
    a.set_xlabel("ρ = λ_q / λ_u")
    a.set_title("(a) hit rate and wasted work")
    a.legend(fontsize=8)
    cold = float(l_cold(entry_len, c))
    curves = [expected_latency(h, x, l_fast(c), float(l_fall(0, c)), cold) for x in ((0.0, 1.0) if g is None else (g,))]
    if g is None:
        b.fill_between(rho, *curves, alpha=0.3, label="E[L_pp] (Eq. 9), g not measured: g = 0 to 1")
    else:
        b.plot(rho, curves[0], label="E[L_pp] (Eq. 9)")
    b.axhline(cold, color="k", ls="--", lw=0.8, label="L_cold")
    b.set_xscale("log")
    b.set_xlabel("ρ = λ_q / λ_u")
    b.set_ylabel("ms")
    b.set_title("(b) expected first-token latency (" + ("g not measured" if g is None else f"g = {g:.3f}") + ")")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
