"""`forerun bench preposition`: the pre-positioning measurements of the paper's Table 1, side by side, one run.

1. Microbenchmarks (HW-1, HW-2): prefill cost per token τ_p (slope of first-token time against unique,
   cache-defeating prompt lengths, scipy.stats.linregress) and T_decode (extra time per generated token on a
   cached prompt).
2. First-token latency arms (HW-5): every iteration ingests (pins) a fresh state with a unique data batch and
   runs one request of each arm on it, in rotating order, each arm with its own query (so no entry is
   cached except its 3-token user-turn opening):
     cold         no pre-position: entry prefill + first token (Eq. 2)
     fast         pre-positioned with the full logit vector kept; gate forced open (τ = −1, A = V) so the
                  arm measures the mechanism itself: lock, exact-match check, vocabulary scan (Eq. 3)
     fall_0       pre-positioned, gate closed, realized entry == pre-positioned entry (Δ = 0, Eq. 5)
     fall_entry   pre-positioned, gate closed, the realized query differs after the opening (Δ ≈ L_entry)
3. Live trace (HW-4): Poisson updates and standing queries at ρ ∈ {0.25, 1, 4}, replayed in real time on a
   streaming session; the measured hit rate h (session counters) against ρ/(1+ρ), Wilson 95 % intervals.
4. Gate calibration on the trend task (HW-3): coverage / false accept at τ and the calibrated τ.
5. The closed form fed by the measured constants (Eqs. 2-10) and, with --plots DIR, Figures 4-7.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np
from scipy.stats import linregress

from .calibration import plot_risk_coverage, wilson_interval
from .latency_model import (
    LatencyConstants,
    expected_latency,
    hit_rate,
    hit_rate_delayed,
    l_cold,
    l_fall,
    plot_amortization,
    plot_cost_anatomy,
    plot_latency_vs_entry,
    poisson_trace,
    replay_trace,
)
from .trend_task import QUESTION, SYSTEM, answer_tokens, collect_pairs, make_windows, report
from ..programs.sessions import SessionFormat, StreamingSession
from ..runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
from ..runtime_ext.protocol import SamplingParams
from ..runtime_ext.preposition.ready_cache import GateConfig, SessionState

ARMS = ("cold", "fast", "fall_0", "fall_entry")


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
    """Mean update interval of the trace (1/λ_u) in seconds; None: `trace_idle_factor` × (ingest + T_pp)."""
    trace_idle_factor: float = 4.0
    """Mean update interval as a multiple of the measured ingest + pre-position time (Eq. 7 needs it ≫ 1)."""
    calib_windows: int = 64
    """Trend windows for the gate calibration (paper: 128 decision points; CPU-sized default 64)."""
    tau: float = 2.0
    """τ reported for the gate (paper default 2.0)."""
    r_max: float = 0.15
    """Risk budget for the calibrated τ."""
    prefill_lengths: tuple[int, ...] = (16, 32, 64, 128)
    """Unique prompt lengths for the τ_p slope."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if self.trace_updates < 0 or self.calib_windows < 0:
            raise ValueError("trace_updates and calib_windows must be >= 0")
        if any(r <= 0 for r in self.rhos):
            raise ValueError(f"rhos must be > 0, got {self.rhos}")
        if self.trace_idle_factor <= 0:
            raise ValueError(f"trace_idle_factor must be > 0, got {self.trace_idle_factor}")
        if self.trace_interval_s is not None and self.trace_interval_s <= 0:
            raise ValueError(f"trace_interval_s must be > 0, got {self.trace_interval_s}")
        if len(self.prefill_lengths) < 2 or min(self.prefill_lengths) < 1:
            raise ValueError("prefill_lengths needs at least two lengths >= 1")


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
        self.system = enc(self.fmt.system.format(system=SYSTEM))
        header = enc(self.fmt.header)
        self.entries = {a: enc(self.fmt.query.format(query=q)) + header for a, q in ARM_QUERIES.items()}
        self.realized_fall_entry = enc(self.fmt.query.format(query=FALL_ENTRY_REALIZED)) + header
        self.entry = self.entries["cold"]
        self.ingest_s: list[float] = []
        self.pp = {
            "cold": Prepositioner(engine, PrepositionConfig(background=False), tokenizer=tokenizer),
            "fast": Prepositioner(engine, PrepositionConfig(gate=GateConfig(threshold=-1.0), keep_logits=True,
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


def run_trace(engine: Any, tokenizer: Any, rho: float, n_updates: int, interval_s: float, gate: GateConfig,
              rng: np.random.Generator, tick: Callable[[], None] | None = None, delay_s: float = 0.0
              ) -> dict[str, Any]:
    """One live trace: Poisson updates / standing queries replayed in real time on a streaming session.

    `delay_s` (the measured ingest + T_pp) only feeds the delayed closed form reported beside the measurement.
    """
    pp = Prepositioner(engine, PrepositionConfig(gate=gate), tokenizer=tokenizer)
    s = StreamingSession(pp, tokenizer=tokenizer, system=SYSTEM)
    s.register_query("trend", QUESTION)
    paths: dict[str, int] = {}
    keep = 4  # data batches kept in the window

    def update() -> None:
        prices = ", ".join(f"{p:.2f}" for p in rng.uniform(50, 150, 8))
        batch_len = len(s.encode(s.fmt.data.format(data=prices)))
        movable = s.state.live_end - s.state.frozen_len
        if movable > keep * batch_len:
            s.state.shift_window(movable - (keep - 1) * batch_len)  # sliding window, part of this update
        s.append_data(prices)
        if tick is not None:
            tick()

    def query() -> None:
        r = s.ask_standing("trend")
        paths[r.path] = paths.get(r.path, 0) + 1

    events = poisson_trace(rho, n_updates, rng)
    lag = replay_trace(events, update, query, interval_s)
    pp.wait_idle(120)
    c = pp.counters
    s.close()
    pp.close()
    resolved = c.consumed + c.invalidated + c.discarded
    lo, hi = wilson_interval(c.consumed, resolved)
    return {"rho": rho, "closed_form_h": hit_rate(rho), "measured_h": c.hit_rate, "h_ci95": [lo, hi],
            "closed_form_h_delayed": float(hit_rate_delayed(rho, delay_s / interval_s)),
            "resolved_prepositions": resolved, "queries": sum(paths.values()), "paths": paths,
            "final_lag_s": lag, "counters": c.as_dict()}


def run_bench(engine: Any, tokenizer: Any, cfg: BenchConfig, *, progress: Callable[[str, int], Any] | None = None,
              plots_dir: str | None = None) -> dict[str, Any]:
    """Everything above; returns one JSON-able dict."""
    rng = np.random.default_rng(cfg.seed)
    vocab = int(getattr(engine, "vocab_size", None) or len(tokenizer))
    bar = progress or (lambda name, total: contextlib.nullcontext(lambda: None))
    out: dict[str, Any] = {"config": asdict(cfg)}

    micro = measure_prefill_and_decode(engine, vocab, cfg.prefill_lengths, rng)
    out["microbench"] = micro
    arms, t_pp = _latency_arms(engine, tokenizer, cfg, rng, bar, out)
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
        "l_fall_entry_ms": float(l_fall(L_entry, consts)), "l_fast_ms": consts.scan_ms,
    }
    calib = _gate_calibration(engine, tokenizer, cfg, bar, plots_dir) if cfg.calib_windows else None
    if calib is not None:
        out["gate"] = calib
    if cfg.trace_updates and cfg.rhos:
        update_cost = float(np.median(t_pp)) + float(np.median(arms.ingest_s))  # ingest + pre-position
        out["trace"] = _live_traces(engine, tokenizer, cfg, rng, bar, update_cost)
    g = calib["at_tau"]["coverage"] if calib else 0.0
    out["expected_latency_ms"] = {
        str(rho): float(expected_latency(hit_rate(rho), g, p50["fast"], p50["fall_0"], p50["cold"]))
        for rho in cfg.rhos
    }
    out["gate_fire_probability_g"] = g
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
    """Gate calibration on the trend task (HW-3); Figure 7 with `plots_dir`."""
    windows = make_windows(cfg.calib_windows, seed=cfg.seed + 1)
    with bar("trend-task calibration", len(windows)) as tick:
        pairs = collect_pairs(engine, tokenizer, windows, progress=tick)
    rep, points = report(pairs, tau=cfg.tau, r_max=cfg.r_max, answer_set_size=len(answer_tokens(tokenizer)))
    calib = rep.as_dict()
    calib["fast_tokens"] = _top_counts([tokenizer.decode([p.fast_token]) for p in pairs])
    calib["full_tokens"] = _top_counts([tokenizer.decode([p.full_token]) for p in pairs])
    if plots_dir:
        plot_risk_coverage(points, f"{plots_dir}/fig7_risk_coverage.png", title=f"trend task, {len(pairs)} windows")
    return calib


def _live_traces(engine: Any, tokenizer: Any, cfg: BenchConfig, rng: np.random.Generator, bar: Callable,
                 update_cost: float) -> dict[str, Any]:
    """The live trace (HW-4) at every ρ, with the mean update interval from the measured update cost."""
    interval = cfg.trace_interval_s or cfg.trace_idle_factor * update_cost
    gate = GateConfig(threshold=cfg.tau, fast_answer_set=frozenset(answer_tokens(tokenizer)))
    traces = []
    with bar("live trace", (cfg.trace_updates + 1) * len(cfg.rhos)) as tick:
        for rho in cfg.rhos:
            traces.append(run_trace(engine, tokenizer, rho, cfg.trace_updates, interval, gate, rng, tick,
                                    delay_s=update_cost))
    return {"interval_s": interval, "update_cost_s": update_cost, "points": traces}


def _plots(out: dict[str, Any], consts: LatencyConstants, g: float, plots_dir: str) -> None:
    """Figures 4-6 from the measured constants (Figure 7 is drawn by the gate calibration)."""
    p50 = {a: out["latency"][a]["p50_ms"] for a in ARMS}
    L_entry = out["entry_len"]
    plot_latency_vs_entry(consts, f"{plots_dir}/fig4_latency_vs_entry.png", measured_entry=L_entry,
                          measured_cold=[(L_entry, p50["cold"])])
    plot_cost_anatomy(consts, L_entry, f"{plots_dir}/fig5_cost_anatomy.png",
                      measured=[p50["cold"], p50["fall_0"], p50["fall_entry"], p50["fast"]])
    measured = [(t["rho"], t["measured_h"], *t["h_ci95"]) for t in out.get("trace", {}).get("points", [])]
    plot_amortization(consts, L_entry, g, f"{plots_dir}/fig6_amortization.png", measured=measured)
    out["plots"] = plots_dir


def _top_counts(xs: Sequence[str], k: int = 5) -> dict[str, int]:
    vals, counts = np.unique(np.asarray(xs, dtype=object).astype(str), return_counts=True)
    order = np.argsort(-counts)[:k]
    return {str(vals[i]): int(counts[i]) for i in order}


def format_report(res: dict[str, Any]) -> str:
    """Human-readable summary of `run_bench`'s result."""
    lines = []
    m = res["microbench"]
    lines.append(f"prefill τ_p = {m['prefill_ms_per_token']:.3f} ms/token (r² {m['prefill_r2']:.3f}), "
                 f"T_decode = {m['decode_ms']:.2f} ms, entry L_entry = {res['entry_len']} tokens")
    lines.append(f"{'arm':<12}{'P50 ms':>10}{'P99 ms':>10}{'mean ms':>10}{'n':>6}{'Δ':>6}")
    for a, s in res["latency"].items():
        lines.append(f"{a:<12}{s['p50_ms']:>10.3f}{s['p99_ms']:>10.3f}{s['mean_ms']:>10.3f}{s['n']:>6}"
                     f"{s['mean_delta']:>6.1f}")
    r = res["ratios"]
    lines.append(f"L_cold / L_fast (P50) = {r['cold_over_fast_p50']:.1f}x;  L_fall(Δ=0) / L_cold = "
                 f"{r['fall0_over_cold_p50']:.3f};  L_fall(Δ=L_entry) / L_cold = {r['fall_entry_over_cold_p50']:.3f}")
    p = res["preposition_ms"]
    lines.append(f"pre-position T_pp (off the critical path): P50 {p['p50_ms']:.2f} ms")
    cf = res["closed_form"]
    lines.append(f"closed form: L_cold {cf['l_cold_ms']:.2f}, L_fall(0) {cf['l_fall0_ms']:.2f}, "
                 f"L_fall(L) {cf['l_fall_entry_ms']:.2f}, L_fast {cf['l_fast_ms']:.3f} ms "
                 f"(T_restore residual {res['restore_residual_ms']:.2f} ms)")
    if "gate" in res:
        g = res["gate"]
        at = g["at_tau"]
        lines.append(f"gate on trend task (n={g['n']}, |A|={g['answer_set_size']}): at τ={at['threshold']:g} coverage "
                     f"{at['coverage']:.3f} [{at['coverage_ci'][0]:.3f}, {at['coverage_ci'][1]:.3f}], false accept "
                     f"{at['false_accept']:.3f}; agreement {g['agreement']:.3f}, full-path accuracy "
                     f"{g['full_accuracy']:.3f}, cached-token accuracy {g['fast_accuracy']:.3f}; γ quantiles "
                     f"{[round(x, 3) for x in g['gap_quantiles']]}")
        cal = g["calibrated"]
        lines.append("calibrated τ (r ≤ %.2f): %s" % (g["r_max"], "none" if cal is None else
                     f"{cal['threshold']:.3f} (coverage {cal['coverage']:.3f}, false accept {cal['false_accept']:.3f})"))
        lines.append(f"cached tokens: {g['fast_tokens']}; full-path tokens: {g['full_tokens']}")
    if "trace" in res:
        tr = res["trace"]
        lines.append(f"live trace (mean update interval {tr['interval_s'] * 1e3:.0f} ms; ingest + T_pp "
                     f"{tr.get('update_cost_s', float('nan')) * 1e3:.0f} ms):")
        for t in res["trace"]["points"]:
            lines.append(f"  ρ={t['rho']:<5g} h measured {t['measured_h']:.3f} [{t['h_ci95'][0]:.3f}, "
                         f"{t['h_ci95'][1]:.3f}] over {t['resolved_prepositions']} pre-positions; closed form "
                         f"{t['closed_form_h']:.3f} (with install delay {t.get('closed_form_h_delayed', float('nan')):.3f}); "
                         f"queries {t['queries']} {t['paths']}")
    lines.append("E[L_pp] (Eq. 9, g = %.3f): %s ms" % (res["gate_fire_probability_g"],
                 {k: round(v, 2) for k, v in res["expected_latency_ms"].items()}))
    return "\n".join(lines)
