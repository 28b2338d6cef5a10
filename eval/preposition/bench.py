"""`forerun bench preposition`: the pre-positioning measurements of the paper's Table 1, side by side, one run.

1. Microbenchmarks (HW-1, HW-2): prefill cost per token τ_p (slope of first-token time against unique,
   cache-defeating prompt lengths, scipy.stats.linregress) and T_decode (extra time per generated token on a
   cached prompt).
2. First-token latency arms (HW-5): every iteration ingests (pins) a fresh state with a unique data batch and
   runs one request of each arm on it, in rotating order, each arm with its own query (so no entry is
   cached except its 3-token user-turn opening):
     cold         no pre-position: entry prefill + first token (Eq. 2)
     fast         pre-positioned with the full logit vector kept; gate forced open (GateConfig.forced_open)
                  so the arm times the mechanism itself: lock, exact-match check, vocabulary scan (Eq. 3)
     fall_0       pre-positioned, gate closed, realized entry == pre-positioned entry (Δ = 0, Eq. 5)
     fall_entry   pre-positioned, gate closed, the realized query differs after the opening (Δ ≈ L_entry)
3. Gate calibration (HW-3): the paper's trend task (coverage / false accept at τ on all windows; τ for r_max
   picked on alternate windows, judged on the others), and the status-feed task
   (`status_task`) where the default model is confident: τ picked on calibration windows for r ≤ r_max,
   judged on held-out windows (Wilson 95 %).  `--tau auto` runs the live traces at that τ.
4. Live traces, gate never forced (HW-4, `live_trace`): the status feed at ρ ∈ {0.25, 1, 4} (h and the
   un-forced fast-path hits h_fast against the closed form) and an agentic session (§3.5: results
   pre-positioned from history, how often the gate serves them).
5. Energy per pre-position (HW-6, `energy`): RAPL or NVML where present, else "unavailable" with the reason.
6. The closed form fed by the measured constants (Eqs. 2-10) and, with --plots DIR, Figures 4-7.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict
from typing import Any, Callable, Sequence

import numpy as np
from scipy.stats import linregress

from . import status_task, trend_task
from .calibration import calibrate_held_out, gap_quantiles, gate_point, plot_risk_coverage
from .energy import Unavailable, detect_meter, preposition_energy, wasted_energy
from .latency_model import (
    LatencyConstants,
    expected_latency,
    hit_rate,
    l_cold,
    l_fall,
    plot_amortization,
    plot_cost_anatomy,
    plot_latency_vs_entry,
)
from .config import BenchConfig, check_trace_interval
from .report import top_counts
from .live_trace import run_agentic_trace, run_status_trace, status_update_cost
from ...programs.sessions import SessionFormat
from ...runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
from ...runtime_ext.protocol import SamplingParams
from ...runtime_ext.preposition.ready_cache import SessionState
from ...runtime_ext.preposition.gate import GateConfig

ARMS = ("cold", "fast", "fall_0", "fall_entry")
FIGURE_FILES = {4: "fig4_latency_vs_entry.png", 5: "fig5_cost_anatomy.png", 6: "fig6_amortization.png",
                7: "fig7_risk_coverage.png"}
"""The files `run_bench` writes in `plots_dir`, by figure of the paper (7: only with the gate calibration)."""


def _pct(xs: Sequence[float]) -> dict[str, float]:
    a = np.asarray(xs, dtype=float) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "mean_ms": float(a.mean()), "std_ms": float(a.std(ddof=1)) if a.size > 1 else 0.0, "n": int(a.size)}


def measure_prefill_and_decode(engine: Any, vocab: int, lengths: Sequence[int], rng: np.random.Generator,
                               reps: int = 5, decode_tokens: int = 16) -> dict[str, Any]:
    """τ_p from unique random prompts (HW-1) and T_decode from extra tokens on a cached prompt (HW-2)."""
    one = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
    xs, ys = [], []
    for n in lengths:
        for _ in range(reps):
            ids = [int(t) for t in rng.integers(100, vocab - 1, n)]  # unique: defeats the prefix cache
            t0 = time.perf_counter()
            engine.generate(ids, one)
            ys.append((time.perf_counter() - t0) * 1e3)
            xs.append(n)
    lens = sorted(set(xs))
    med = [float(np.median([y for x, y in zip(xs, ys) if x == n])) for n in lens]
    fit = linregress(lens, med)  # medians per length: robust to a loaded machine
    prompt = [int(t) for t in rng.integers(100, vocab - 1, 32)]
    many = SamplingParams(max_new_tokens=1 + decode_tokens, temperature=0.0, ignore_eos=True)
    engine.generate(prompt, one)  # cache the prompt
    per_token = []
    for _ in range(reps):
        t0 = time.perf_counter()
        engine.generate(prompt, one)
        t1 = time.perf_counter()
        engine.generate(prompt, many)
        t2 = time.perf_counter()
        per_token.append(((t2 - t1) - (t1 - t0)) / decode_tokens * 1e3)
    return {"prefill_ms_per_token": float(fit.slope), "prefill_intercept_ms": float(fit.intercept),
            "prefill_r2": float(fit.rvalue ** 2), "decode_ms": float(np.median(per_token)),
            "prefill_points": [[int(n), m] for n, m in zip(lens, med)]}


ARM_QUERIES = {
    "cold": "Is the trend up or down?",
    "fast": "Are prices rising or falling?",
    "fall_0": "Which direction is the trend?",
    "fall_entry": "Do prices go up or down?",
}
"""One query per arm so that no arm's entry is cached by another on the shared state (only the 3-token
user-turn opening is common to all entries; the arm order rotates every iteration)."""
FALL_ENTRY_REALIZED = "Which way are prices moving now?"
"""The realized query of the fall_entry arm: differs from the pre-positioned one right after the opening."""


class _Arms:
    """One fresh, ingested session state per iteration; each arm runs one request on it."""

    def __init__(self, engine: Any, tokenizer: Any, rng: np.random.Generator) -> None:
        self.engine = engine
        self.tok = tokenizer
        self.rng = rng
        self.fmt = SessionFormat()
        enc = lambda t: [int(x) for x in tokenizer.encode(t, add_special_tokens=False)]  # noqa: E731
        self._enc = enc
        self.system = enc(self.fmt.system.format(system=trend_task.SYSTEM))
        header = enc(self.fmt.header)
        self.entries = {a: enc(self.fmt.query.format(query=q)) + header for a, q in ARM_QUERIES.items()}
        self.realized_fall_entry = enc(self.fmt.query.format(query=FALL_ENTRY_REALIZED)) + header
        self.entry = self.entries["cold"]
        self.ingest_s: list[float] = []
        self.pp = {
            "cold": Prepositioner(engine, PrepositionConfig(background=False), tokenizer=tokenizer),
            "fast": Prepositioner(engine, PrepositionConfig(gate=GateConfig.forced_open(), keep_logits=True,
                                                            background=False), tokenizer=tokenizer),
            "fall": Prepositioner(engine, PrepositionConfig(gate=GateConfig(threshold=float("inf")),
                                                            background=False), tokenizer=tokenizer),
        }

    def iteration(self, order: Sequence[str]) -> dict[str, tuple[Any, float | None]]:
        prices = ", ".join(f"{p:.2f}" for p in self.rng.uniform(50, 150, 8))
        tokens = self.system + self._enc(self.fmt.data.format(data=prices))
        t0 = time.perf_counter()
        handle = self.engine.pin(tokens)  # ingest: the state's KV is resident, no entry is
        self.ingest_s.append(time.perf_counter() - t0)
        out: dict[str, tuple[Any, float | None]] = {}
        try:
            for arm in order:
                # each arm gets its own SessionState over the same (cached) tokens: independent ready slots
                state = SessionState(tokens, frozen_len=len(self.system))
                entry = self.entries[arm]
                if arm == "cold":
                    out[arm] = (self.pp["cold"].serve(state, entry), None)
                    continue
                pp = self.pp["fast" if arm == "fast" else "fall"]
                t0 = time.perf_counter()
                pp.preposition(state, entry)
                t_pp = time.perf_counter() - t0
                r = pp.serve(state, entry if arm != "fall_entry" else self.realized_fall_entry)
                state.close()  # releases the pre-paid entry's pin
                pp.release_pins(state)
                expected = {"fast": "fast", "fall_0": "fall", "fall_entry": "fall"}[arm]
                if r.path != expected:
                    raise AssertionError(f"arm {arm} took path {r.path}")
                out[arm] = (r, t_pp)
        finally:
            self.engine.unpin(handle)
        return out

    def close(self) -> None:
        for p in self.pp.values():
            p.close()


def run_bench(engine: Any, tokenizer: Any, cfg: BenchConfig, *, progress: Callable[[str, int], Any] | None = None,
              plots_dir: str | None = None, meter: Any = None) -> dict[str, Any]:
    """Everything above; returns one JSON-able dict.  `meter`: an energy meter (default: `detect_meter()`)."""
    rng = np.random.default_rng(cfg.seed)
    vocab = int(getattr(engine, "vocab_size", None) or len(tokenizer))
    bar = progress or (lambda name, total: contextlib.nullcontext(lambda: None))
    out: dict[str, Any] = {"config": asdict(cfg)}

    micro = measure_prefill_and_decode(engine, vocab, cfg.prefill_lengths, rng)
    out["microbench"] = micro
    _latency_arms(engine, tokenizer, cfg, rng, bar, out)
    p50 = {a: out["latency"][a]["p50_ms"] for a in ARMS}
    consts = LatencyConstants(
        prefill_ms_per_token=max(micro["prefill_ms_per_token"], 0.0), decode_ms=max(micro["decode_ms"], 0.0),
        scan_ms=p50["fast"], restore_ms=max(p50["fall_0"] - micro["decode_ms"], 0.0),
    )
    L_entry = out["entry_len"]
    out["constants"] = consts.as_dict()
    out["restore_residual_ms"] = p50["fall_0"] - micro["decode_ms"]
    out["closed_form"] = {
        "l_cold_ms": float(l_cold(L_entry, consts)), "l_fall0_ms": float(l_fall(0, consts)),
        # at the fall_entry arm's measured Δ: its realized query is not the cold arm's length
        "l_fall_entry_ms": float(l_fall(out["latency"]["fall_entry"]["mean_delta"], consts)),
        "l_fast_ms": consts.scan_ms,
    }
    calib = _gate_calibration(engine, tokenizer, cfg, bar, plots_dir) if cfg.calib_windows else None
    if calib is not None:
        out["gate"] = calib
    status = _status_gate(engine, tokenizer, cfg, bar) if cfg.status_windows else None
    tau, g, g_source = _live_tau(cfg, status)
    out["live_tau"] = tau
    out["gate_fire_probability_g"] = g
    out["gate_fire_probability_g_source"] = g_source
    if status is not None:
        out["status_gate"] = status["report"]
    if cfg.trace_updates and cfg.rhos:
        # the trace's own session (few-shot history, 4-batch window) costs far more per update than the arms'
        update_cost = status_update_cost(engine, tokenizer, rng)
        out["trace"] = _live_traces(engine, tokenizer, cfg, rng, bar, update_cost, tau, g)
    if cfg.agentic_turns:
        with bar("agentic trace", cfg.agentic_turns) as tick:
            out["agentic"] = run_agentic_trace(engine, tokenizer, cfg.agentic_turns, GateConfig(threshold=tau), rng,
                                               tick=tick)
    out["energy"] = _energy(engine, tokenizer, cfg, rng, meter, out)
    out["expected_latency_ms"] = None if g is None else {  # Eq. 9 needs g: not computed without it
        str(rho): float(expected_latency(hit_rate(rho), g, p50["fast"], p50["fall_0"], p50["cold"]))
        for rho in cfg.rhos
    }
    if plots_dir:
        _plots(out, consts, g, plots_dir)
    return out


def _latency_arms(engine: Any, tokenizer: Any, cfg: BenchConfig, rng: np.random.Generator, bar: Callable,
                  out: dict[str, Any]) -> tuple[_Arms, list[float]]:
    """The four first-token latency arms (HW-5), in rotating order; fills `out` with their statistics and
    returns the arms (for the measured ingest times) and the pre-position times T_pp."""
    arms = _Arms(engine, tokenizer, rng)
    lat: dict[str, list[float]] = {a: [] for a in ARMS}
    t_pp: list[float] = []
    deltas: dict[str, list[int]] = {a: [] for a in ARMS}
    cached: dict[str, list[int]] = {a: [] for a in ARMS}
    with bar("latency arms", cfg.requests) as tick:
        for i in range(cfg.requests):
            order = ARMS[i % len(ARMS):] + ARMS[: i % len(ARMS)]
            for arm, (r, tp) in arms.iteration(order).items():
                if tp is not None:
                    t_pp.append(tp)
                lat[arm].append(r.latency_s)
                deltas[arm].append(r.delta)
                if r.cached_tokens is not None:
                    cached[arm].append(r.cached_tokens)
            tick()
    arms.close()
    stats = {a: _pct(v) for a, v in lat.items()}
    for a in ARMS:
        stats[a]["mean_delta"] = float(np.mean(deltas[a]))
        if cached[a]:
            stats[a]["mean_cached_tokens"] = float(np.mean(cached[a]))
    p50 = {a: stats[a]["p50_ms"] for a in ARMS}
    out["entry_len"] = len(arms.entry)
    out["entry_len_per_arm"] = {a: len(e) for a, e in arms.entries.items()}
    out["system_len"] = len(arms.system)
    out["latency"] = stats
    out["preposition_ms"] = _pct(t_pp)
    out["ingest_ms"] = _pct(arms.ingest_s)
    out["ratios"] = {
        "cold_over_fast_p50": p50["cold"] / p50["fast"],
        "fall0_over_cold_p50": p50["fall_0"] / p50["cold"],
        "fall_entry_over_cold_p50": p50["fall_entry"] / p50["cold"],
    }
    return arms, t_pp


def _gate_calibration(engine: Any, tokenizer: Any, cfg: BenchConfig, bar: Callable,
                      plots_dir: str | None) -> dict[str, Any]:
    """Gate on the paper's trend task (HW-3): at the reference τ, and τ for r_max picked on half the windows and
    judged on the other half (`trend_task.SPLIT`); Figure 7 (all windows) with `plots_dir`."""
    windows = trend_task.drawn_windows(cfg.calib_windows, seed=cfg.seed + 1)  # each drawn as the bar reaches it
    with bar("trend-task calibration", len(windows)) as tick:
        pairs = trend_task.collect_pairs(engine, tokenizer, windows, progress=tick)
    tau = 2.0 if cfg.tau == "auto" else float(cfg.tau)
    rep, points = trend_task.report(pairs, tau=tau, r_max=cfg.r_max,
                                    answer_set_size=len(trend_task.answer_tokens(tokenizer)))
    calib = rep.as_dict()
    calib["fast_tokens"] = top_counts([tokenizer.decode([p.fast_token]) for p in pairs])
    calib["full_tokens"] = top_counts([tokenizer.decode([p.full_token]) for p in pairs])
    if plots_dir:
        plot_risk_coverage(points, f"{plots_dir}/{FIGURE_FILES[7]}",
                           title=f"trend task, all {len(pairs)} windows", tau_marker=tau)
    return calib


def _status_gate(engine: Any, tokenizer: Any, cfg: BenchConfig, bar: Callable) -> dict[str, Any]:
    """The status-feed task: τ calibrated on one set of windows, judged on held-out ones (Wilson 95 %)."""
    calib_w = status_task.drawn_windows(cfg.status_windows, seed=cfg.seed + 11)  # each drawn as the bar reaches it
    held_w = status_task.drawn_windows(cfg.status_windows, seed=cfg.seed + 12, exclude=calib_w)  # disjoint
    with bar("status-feed calibration", 2 * cfg.status_windows) as tick:
        calib = status_task.collect_pairs(engine, tokenizer, calib_w, progress=tick)
        held = status_task.collect_pairs(engine, tokenizer, held_w, progress=tick)
    tau = 2.0 if cfg.tau == "auto" else float(cfg.tau)
    exact = calibrate_held_out([p.exact_pair() for p in calib], [p.exact_pair() for p in held], r_max=cfg.r_max,
                               tau=tau)
    relaxed = calibrate_held_out([p.relaxed_pair() for p in calib], [p.relaxed_pair() for p in held],
                                 r_max=cfg.r_max, tau=tau)
    report = {
        "windows": cfg.status_windows, "question": status_task.QUESTION, "lead_in": status_task.LEAD,
        "answer_set_size": len(status_task.answer_tokens(tokenizer)),
        "exact": exact.as_dict(), "relaxed": relaxed.as_dict(),
        "held_out_accuracy_exact": float(np.mean([p.label == p.truth for p in held])),
        "held_out_accuracy_header": float(np.mean([p.header_label == p.truth for p in held])),
        "held_out_agreement_exact_full": float(np.mean([p.token == p.full_token for p in held])),
        "held_out_gap_quantiles_exact": gap_quantiles([p.gap for p in held]),
        "held_out_tokens_exact": top_counts([tokenizer.decode([p.token]) for p in held]),
    }
    return {"report": report, "exact": exact, "held": held}


def _live_tau(cfg: BenchConfig, status: dict[str, Any] | None) -> tuple[float, float | None, str]:
    """(τ of the live traces, g, where g comes from): g is the held-out status-feed gate coverage at τ, or None
    (not measured) when the status calibration was skipped."""
    tau = status["exact"].auto_tau if cfg.tau == "auto" and status is not None else float(cfg.tau)
    if status is None:
        return tau, None, "not measured: the status calibration was skipped (status_windows = 0)"
    held = [p.exact_pair() for p in status["held"]]
    source = f"exact-gate coverage at the live τ on {len(held)} held-out status-feed windows"
    return tau, gate_point(held, tau).coverage, source


def _live_traces(engine: Any, tokenizer: Any, cfg: BenchConfig, rng: np.random.Generator, bar: Callable,
                 update_cost: float, tau: float, g: float | None) -> dict[str, Any]:
    """The status-feed live trace (HW-4) at every ρ, gate un-forced at τ; mean update interval from the
    measured update cost."""
    interval = cfg.trace_interval_s or check_trace_interval(cfg.trace_idle_factor * update_cost,
                                                            f"trace_idle_factor {cfg.trace_idle_factor:g}")
    gate = GateConfig(threshold=tau, fast_answer_set=frozenset(status_task.answer_tokens(tokenizer)))
    traces = []
    with bar("live trace", (cfg.trace_updates + 1) * len(cfg.rhos)) as tick:
        for rho in cfg.rhos:
            traces.append(run_status_trace(engine, tokenizer, rho, cfg.trace_updates, interval, gate, rng, tick=tick,
                                           delay_s=update_cost, gate_coverage=g))
    return {"interval_s": interval, "update_cost_s": update_cost, "tau": tau, "gate_coverage_g": g,
            "points": traces}


def _energy(engine: Any, tokenizer: Any, cfg: BenchConfig, rng: np.random.Generator, meter: Any,
            out: dict[str, Any]) -> dict[str, Any]:
    """Joules per pre-position and the wasted energy vs ρ (HW-6), or why they are unavailable."""
    meter = detect_meter() if meter is None else meter
    if isinstance(meter, Unavailable):
        return {"available": False, "reason": meter.reason}
    if not cfg.energy_iterations:
        return {"available": True, "source": meter.source, "skipped": "energy_iterations = 0"}
    pp = Prepositioner(engine, PrepositionConfig(gate=GateConfig(threshold=float("inf"))), tokenizer=tokenizer)
    s = status_task.status_session(pp, tokenizer, allow_relaxed=False)
    s.append_data(status_task.batch_text(rng, "up"), preposition=False)
    s.register_query("status", status_task.QUESTION)
    lengths: list[int] = []

    def update(preposition: bool) -> None:
        if len(lengths) >= 4:
            s.state.shift_window(lengths.pop(0))
        before = s.state.live_end
        s.append_data(status_task.batch_text(rng, str(rng.choice(status_task.LABELS))), preposition=preposition)
        lengths.append(s.state.live_end - before)
        pp.wait_idle(60, session=s.state)

    try:
        res: dict[str, Any] = preposition_energy(meter, lambda: update(True), lambda: update(False),
                                                 cfg.energy_iterations, idle_s=cfg.energy_idle_s)
    finally:
        s.close()
        pp.close()
    res.update(available=True, source=meter.source)
    trace = out.get("trace")
    if trace:
        e, interval = res["joules_per_preposition"], trace["interval_s"]
        res["wasted_vs_rho"] = [{"rho": p["rho"], "measured_h": p["measured_h"],
                                 "measured": wasted_energy(e, p["measured_h"], interval),
                                 "closed_form": wasted_energy(e, hit_rate(p["rho"]), interval)}
                                for p in trace["points"]]
    return res


def _plots(out: dict[str, Any], consts: LatencyConstants, g: float | None, plots_dir: str) -> None:
    """Figures 4-6 from the measured constants (Figure 7 is drawn by the gate calibration)."""
    p50 = {a: out["latency"][a]["p50_ms"] for a in ARMS}
    L_entry = out["entry_len"]
    plot_latency_vs_entry(consts, f"{plots_dir}/{FIGURE_FILES[4]}", measured_entry=L_entry,
                          measured_cold=[(L_entry, p50["cold"])])
    plot_cost_anatomy(consts, L_entry, f"{plots_dir}/{FIGURE_FILES[5]}",
                      measured=[p50["cold"], p50["fall_0"], p50["fall_entry"], p50["fast"]])
    points = out.get("trace", {}).get("points", [])
    measured = [(t["rho"], t["measured_h"], *t["h_ci95"]) for t in points]
    fast = [(t["rho"], t["h_fast"]["rate"], *t["h_fast"]["ci95"]) for t in points if t["h_fast"]["n"]]
    plot_amortization(consts, L_entry, g, f"{plots_dir}/{FIGURE_FILES[6]}", measured=measured, measured_fast=fast)
    out["plots"] = plots_dir
