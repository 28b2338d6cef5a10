"""`forerun session demo`, `forerun bench preposition` and `forerun calibrate gate`: pre-positioning commands.

    forerun session demo [--model tiny|default|PATH] [--tau T] [--json]
    forerun bench preposition [--model default] [--requests 128] [--trace-updates 32] [--rhos 0.25,1,4]
                              [--calib-windows 64] [--status-windows 64] [--tau 2.0|auto] [--r-max 0.05]
                              [--agentic-turns 24] [--energy-iterations 16] [--plots DIR] [--json]
    forerun calibrate gate [--model default] [--task trend|status] [--windows 128] [--tau 2.0] [--r-max 0.05]
                           [--answer-lead TEXT] [--plot PATH] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from typing import Any, Iterator

from .args import (
    add_model_arguments,
    comma_items,
    gate_threshold,
    gate_threshold_or_auto,
    nonnegative_int,
    positive_float,
    positive_int,
    seed_int,
    thread_count,
    utf8_text,
)
from .applicability import reject_inapplicable
from .config_flags import flags_named
from .errors import CommandError, reports_errors
from ..eval.preposition.config import BenchConfig
from ..runtime_ext.preposition.gate import GateConfig
from .output import PLOT_SUFFIXES, make_output_dir, output_dir, output_file, print_json, progress_bar

__all__ = ["register", "session_demo_command", "bench_preposition_command", "calibrate_gate_command"]

TAU_REASONS = {key: "τ = inf: the gate never fires" for key in ("tau", "threshold", "live_tau", "auto_tau")} | {
    "rate": "no observations (n = 0): the rate is undefined", "ci95": "no observations (n = 0)",
    "mean_delta_unpredicted": "every result was pre-positioned: no delta-only resume",
    "hit_rate": "no pre-position was resolved", "wasted_fraction": "no pre-position was resolved",
}

NO_CALIBRATED_TAU = "no τ has r(τ) ≤ r_max with a decision point accepted on the calibration windows"


def _uncalibrated(calibration: dict[str, Any], path: str, more: dict[str, Any] | None = None) -> dict[str, Any]:
    """{"undefined": reasons} for a calibration's nulls that are None, not NaN (print_json explains only non-finite
    floats), merged with `more` (another such dict); {} when there are none."""
    reasons = dict((more or {}).get("undefined", {}))
    if calibration["calibrated"] is None:
        reasons |= {f"{path}.calibrated": NO_CALIBRATED_TAU, f"{path}.held_out_at_calibrated": NO_CALIBRATED_TAU}
    return {"undefined": reasons} if reasons else {}


def _rhos(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in comma_items(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not vals or any(not (v > 0 and math.isfinite(v)) for v in vals):
        raise argparse.ArgumentTypeError(f"every ρ must be a finite number > 0, got {text!r}")
    return vals


def _window_len(text: str) -> int:
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"a trend window needs at least 2 prices, got {value}")
    return value


def _engine_arguments(p: argparse.ArgumentParser, *, default_model: str = "default") -> None:
    add_model_arguments(p, default=default_model)
    p.add_argument("--threads", type=thread_count, default=None,
                   help="torch threads, at most the CPUs of this machine (default: torch's choice)")
    p.add_argument("--json", action="store_true", help="print a JSON object on stdout")


_BENCH = BenchConfig()
"""`bench preposition`'s defaults, read from its config type."""
_GATE = GateConfig()
"""The gate's default τ (the paper's 2.0), read from its config type."""


def register(subparsers: Any, bench_subparsers: Any) -> None:
    sess = subparsers.add_parser("session", help="stateful sessions with speculative pre-positioning")
    sess_sub = sess.add_subparsers(dest="session_command", required=True)
    d = sess_sub.add_parser("demo", help="a short streaming and agentic session: path and latency per request")
    d.add_argument("--tau", type=gate_threshold, default=_GATE.threshold,
                   help=f"gate threshold τ (default {_GATE.threshold:g}; inf: never fires)")
    _engine_arguments(d, default_model="tiny")
    d.set_defaults(handler=session_demo_command)

    b = bench_subparsers.add_parser("preposition", help="pre-positioning: L_cold / L_fast / L_fall, hit rate vs ρ, gate")
    b.add_argument("--requests", type=positive_int, default=_BENCH.requests,
                   help=f"requests per latency arm ({_BENCH.requests})")
    b.add_argument("--trace-updates", type=nonnegative_int, default=_BENCH.trace_updates,
                   help=f"updates per ρ in the live trace ({_BENCH.trace_updates}; 0 skips)")
    b.add_argument("--trace-interval", type=positive_float, default=None,
                   help="mean update interval of the trace in seconds (default: --trace-idle-factor x measured "
                        "ingest + pre-position)")
    b.add_argument("--trace-idle-factor", type=positive_float, default=_BENCH.trace_idle_factor,
                   help=f"mean update interval / (ingest + T_pp) when --trace-interval is not given "
                        f"({_BENCH.trace_idle_factor:g})")
    b.add_argument("--rhos", type=_rhos, default=_BENCH.rhos,
                   help=f"query-to-update ratios ({','.join(f'{r:g}' for r in _BENCH.rhos)})")
    b.add_argument("--calib-windows", type=nonnegative_int, default=_BENCH.calib_windows,
                   help=f"windows of the paper's trend task for its gate report, split in half to pick τ and judge "
                        f"it ({_BENCH.calib_windows}; 0 skips, else >= 2)")
    b.add_argument("--status-windows", type=nonnegative_int, default=_BENCH.status_windows,
                   help=f"status-feed windows to calibrate τ on, and as many held out ({_BENCH.status_windows}; 0 skips)")
    b.add_argument("--tau", type=gate_threshold_or_auto, default=_BENCH.tau,
                   help="gate threshold τ of the live traces: a number >= 0, inf, or auto (the status calibration's "
                        f"τ for --r-max); default {_BENCH.tau}")
    b.add_argument("--r-max", type=float, default=_BENCH.r_max,
                   help=f"risk budget for the calibrated τ, in [0, 1] ({_BENCH.r_max:g})")
    b.add_argument("--agentic-turns", type=nonnegative_int, default=_BENCH.agentic_turns,
                   help=f"tool calls in the agentic trace ({_BENCH.agentic_turns}; 0 skips)")
    b.add_argument("--energy-iterations", type=nonnegative_int, default=_BENCH.energy_iterations,
                   help=f"updates per energy loop where RAPL/NVML exists ({_BENCH.energy_iterations}; 0 skips)")
    b.add_argument("--plots", default=None, help="directory for Figures 4-7 (PNG); its parent must exist")
    b.add_argument("--seed", type=seed_int, default=_BENCH.seed)
    _engine_arguments(b)
    b.set_defaults(handler=bench_preposition_command)

    cal = subparsers.add_parser("calibrate", help="calibration commands")
    cal_sub = cal.add_subparsers(dest="calibrate_command", required=True)
    g = cal_sub.add_parser("gate", help="sweep the pre-positioning gate τ on the streaming trend task")
    g.add_argument("--task", choices=("trend", "status"), default="trend",
                   help="trend: the paper's price-trend task (τ picked on alternate windows, judged on the "
                        "others); status: the status feed (τ picked on --windows windows, judged on as many "
                        "held-out ones)")
    g.add_argument("--windows", type=positive_int, default=128,
                   help="windows (decision points), 128; trend: at least 2, split in half")
    g.add_argument("--window-len", type=_window_len, default=None,
                   help="prices per trend window, >= 2 (12; trend only)")
    g.add_argument("--tau", type=gate_threshold, default=_GATE.threshold, help=f"τ to report ({_GATE.threshold:g})")
    g.add_argument("--r-max", type=float, default=_BENCH.r_max, help=f"risk budget r_max, in [0, 1] ({_BENCH.r_max:g})")
    g.add_argument("--answer-lead", default=None, type=utf8_text,
                   help="text appended to the assistant header, e.g. 'The trend is' (trend only)")
    g.add_argument("--plot", default=None, help="write the risk-coverage figure (Figure 7) to this PNG/PDF/SVG")
    g.add_argument("--seed", type=seed_int, default=0)
    _engine_arguments(g)
    g.set_defaults(handler=calibrate_gate_command)


def _check_r_max(r_max: float) -> float:
    if not 0.0 <= r_max <= 1.0:  # also rejects NaN
        raise CommandError(f"--r-max must be in [0, 1], got {r_max}")
    return r_max


# ------------------------------------------------------------------------------------------------
def _engine(model: str, dtype: str | None, threads: int | None = None) -> Any:
    from ..runtime_ext.engine import EngineConfig
    from ..runtime_ext.protocol import SamplingParams
    from ..runtime_ext.runtime import open_runtime

    # single-session latency: no gathering window in front of each request
    engine = open_runtime(model, dtype, engine_config=EngineConfig(batch_window_ms=0.0, num_threads=threads)).engine
    try:
        warm = list(engine.tokenizer.encode("warm up the engine", add_special_tokens=False)) or [1]
        engine.generate(warm, SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True))  # first-call costs
        engine.flush_cache()
    except BaseException:
        engine.close()
        raise
    return engine


@contextlib.contextmanager
def _bar(name: str, total: int) -> Iterator[Any]:
    with progress_bar(total=total, desc=name, leave=False) as t:
        yield lambda: t.update(1)


# ------------------------------------------------------------------------------------------------
@reports_errors("session demo")
def session_demo_command(args: argparse.Namespace) -> int:
    from ..eval.preposition.status_task import answer_tokens
    from ..runtime_ext.preposition.gate import GateConfig

    gate = GateConfig(threshold=args.tau)  # validated before the model loads
    with contextlib.closing(_engine(args.model, args.dtype, args.threads)) as engine:
        tok = engine.tokenizer
        streaming_gate = GateConfig(threshold=gate.threshold, fast_answer_set=frozenset(answer_tokens(tok)))
        rows: list[dict[str, Any]] = []
        with _bar("session demo", DEMO_BATCHES * 3 + DEMO_TOOL_CALLS) as tick:
            counters = {"streaming": _streaming_demo(engine, streaming_gate, rows, tick),
                        "agentic": _agentic_demo(engine, gate, rows, tick)}
    if args.json:
        print_json({"model": args.model, "tau": args.tau, "requests": rows, "counters": counters}, indent=2,
                   reasons=TAU_REASONS)
        return 0
    print(f"{'session':<10} {'path':<13} {'ms':>9} {'γ':>7} {'Δ':>4}  request -> token: why")
    for r in rows:
        gap = "-" if r["logit_gap"] is None else f"{r['logit_gap']:.2f}"
        print(f"{r['session']:<10} {r['path']:<13} {r['latency_ms']:>9.3f} {gap:>7} {r['delta']:>4}  "
              f"{r['request']} -> {r['token']!r}: {r['reason']}")
    for name, c in counters.items():
        print(f"{name}: pre-positions run {c['installed']}, skipped {c['skipped']}, consumed {c['consumed']}, "
              f"invalidated {c['invalidated']}, discarded {c['discarded']}; fast {c['served_fast']}, "
              f"fast (relaxed) {c['served_fast_relaxed']}, fall-through {c['fell_through']}, cold {c['cold']}")
    return 0


DEMO_BATCHES = 3
DEMO_TOOL_CALLS = 3


def _demo_row(tok: Any, session: str, request: str, r: Any) -> dict[str, Any]:
    """γ is shown only when the gate tested a distribution for this very request (exact or relaxed match)."""
    return {"session": session, "request": request, "path": r.path, "token": r.text or tok.decode([r.token_id]),
            "latency_ms": r.latency_s * 1e3, "logit_gap": r.logit_gap, "delta": r.delta,
            "cached_tokens": r.cached_tokens, "reason": r.reason}


def _streaming_demo(engine: Any, gate: Any, rows: list[dict[str, Any]], tick: Any) -> dict[str, Any]:
    """Three status batches on a streaming session with a standing query and an ad-hoc one."""
    import numpy as np

    from ..eval.preposition.status_task import QUESTION, batch_text, status_session
    from ..runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner

    tok = engine.tokenizer
    rng = np.random.default_rng(7)
    with Prepositioner(engine, PrepositionConfig(gate=gate), tokenizer=tok) as pp:
        with status_session(pp, tok, allow_relaxed=True) as s:
            for i, label in enumerate(("up", "down", "up")[:DEMO_BATCHES]):
                if i == 0:
                    s.append_data(batch_text(rng, label), preposition=False)
                    s.register_query("status", QUESTION)
                    rows.append(_demo_row(tok, "streaming", "standing query as the first batch lands",
                                          s.ask_standing("status")))
                else:
                    s.append_data(batch_text(rng, label))
                    rows.append(_demo_row(tok, "streaming", f"standing query right after batch {i}",
                                          s.ask_standing("status")))
                tick()
                pp.wait_idle(60, session=s.state)  # the idle window: the pre-position lands before the next query
                rows.append(_demo_row(tok, "streaming", f"standing query, batch {i} status={label}",
                                      s.ask_standing("status")))
                tick()
                rows.append(_demo_row(tok, "streaming", "ad-hoc: 'Is the pump running?'", s.ask("Is the pump running?")))
                tick()
        return pp.counters.as_dict()  # after the session closed (it stays referenced: still counted)


def _agentic_demo(engine: Any, gate: Any, rows: list[dict[str, Any]], tick: Any) -> dict[str, Any]:
    """The same tool call three times: the first result resumes delta-only from the pre-paid envelope; the
    later ones were pre-positioned whole from that history (§3.5), so the gate (τ, A = V) may serve them."""
    from ..programs.sessions import AgenticSession
    from ..runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner

    tok = engine.tokenizer
    with Prepositioner(engine, PrepositionConfig(gate=gate), tokenizer=tok) as pp:
        with AgenticSession(pp, tokenizer=tok) as a:
            a.user("Check pump P1 with the pump_status tool and answer in a few words.")
            for i in range(DEMO_TOOL_CALLS):
                a.emit_tool_call('{"name": "pump_status", "arguments": {"pump": "P1"}}')
                pp.wait_idle(60, session=a.state)  # the tool runs: the envelope is pre-positioned meanwhile
                turn = a.tool_result("ok", max_new_tokens=8)
                known = "pre-positioned from history" if turn.predicted else "not seen before"
                rows.append(_demo_row(tok, "agentic", f"tool_result('ok') #{i + 1} ({known})", turn.first)
                            | {"turn": turn.text})
                tick()
        return pp.counters.as_dict()


@reports_errors("bench preposition")
def bench_preposition_command(args: argparse.Namespace) -> int:
    _check_r_max(args.r_max)
    from ..eval.preposition.bench import FIGURE_FILES, run_bench

    figures = [name for figure, name in FIGURE_FILES.items() if figure != 7 or args.calib_windows]  # 7: calibration
    plots = output_dir(args.plots, "--plots", files=figures, writer="the benchmark")
    from ..eval.preposition.report import format_report

    with flags_named(args, BenchConfig, trace_interval_s="trace_interval"):
        cfg = BenchConfig(requests=args.requests, trace_updates=args.trace_updates, rhos=args.rhos,
                          trace_interval_s=args.trace_interval, trace_idle_factor=args.trace_idle_factor,
                          calib_windows=args.calib_windows, status_windows=args.status_windows, tau=args.tau,
                          r_max=args.r_max, agentic_turns=args.agentic_turns,
                          energy_iterations=args.energy_iterations, seed=args.seed)
    t0 = time.perf_counter()
    with contextlib.closing(_engine(args.model, args.dtype, args.threads)) as engine:
        res = run_bench(engine, engine.tokenizer, cfg, progress=_bar,
                        plots_dir=None if plots is None else str(make_output_dir(plots)))
    res["model"] = args.model
    res["wall_s"] = time.perf_counter() - t0
    if args.json:
        print_json(res, indent=2, reasons=TAU_REASONS)
    else:
        print(f"model {args.model}; {cfg.requests} requests per arm; wall {res['wall_s']:.0f} s")
        print(format_report(res))
    return 0


@reports_errors("calibrate gate")
def calibrate_gate_command(args: argparse.Namespace) -> int:
    _check_r_max(args.r_max)
    trend = args.task == "trend"
    reject_inapplicable([  # the status feed's windows and header are its own: these used to be ignored silently
        ("--window-len", args.window_len is not None, trend, "applies only with --task trend"),
        ("--answer-lead", args.answer_lead is not None, trend, "applies only with --task trend")])
    if trend and args.windows < 2:
        raise CommandError(f"--windows must be >= 2 with --task trend (alternate windows pick τ and judge it), "
                           f"got {args.windows}")
    plot = output_file(args.plot, "--plot", suffixes=PLOT_SUFFIXES)
    if not trend:
        return _calibrate_status(args, plot)
    args.window_len = 12 if args.window_len is None else args.window_len
    args.answer_lead = "" if args.answer_lead is None else args.answer_lead
    from ..eval.preposition.calibration import plot_risk_coverage
    from ..eval.preposition.trend_task import answer_tokens, collect_pairs, drawn_windows, report
    from ..runtime_ext.preposition.engines import context_limit
    from ..runtime_ext.preposition.ready_cache import ContextOverflow

    with contextlib.closing(_engine(args.model, args.dtype, args.threads)) as engine:
        tok = engine.tokenizer
        limit = context_limit(engine)
        if limit is not None and args.window_len > limit:  # was drawn whole first: --window-len 1e14, a MemoryError
            raise CommandError(f"--window-len {args.window_len}: a trend window of {args.window_len} prices cannot fit "
                               f"the model's context window of {limit} tokens (each price is at least one token)")
        windows = drawn_windows(args.windows, args.window_len, seed=args.seed)  # each drawn as the bar reaches it
        with _bar("trend windows", args.windows) as tick:
            try:
                pairs = collect_pairs(engine, tok, windows, progress=tick, answer_lead=args.answer_lead)
            except ContextOverflow as exc:  # was the session's own line, naming neither option that made it long
                raise CommandError(f"--window-len {args.window_len} with an --answer-lead of {len(args.answer_lead)} "
                                   f"characters: a trend window does not fit the model: {exc}") from exc
    rep, points = report(pairs, tau=args.tau, r_max=args.r_max, answer_set_size=len(answer_tokens(tok)))
    if plot is not None:
        plot_risk_coverage(points, str(plot), title=f"trend task, all {len(pairs)} windows, model {args.model}",
                           tau_marker=args.tau)
    if args.json:
        report_dict = rep.as_dict()
        print_json({"model": args.model, "task": "trend", "answer_lead": args.answer_lead, "report": report_dict,
                    "sweep": [p.as_dict() for p in points]}
                   | _uncalibrated(report_dict["calibration"], "report.calibration"),
                   indent=2, reasons=TAU_REASONS)
        return 0
    _print_gate_report(rep, pairs, tok)
    return 0


def _calibrate_status(args: argparse.Namespace, plot: Any) -> int:
    """The status feed: τ for r ≤ r_max picked on --windows windows, judged on as many held-out ones."""
    from ..eval.preposition.calibration import calibrate_held_out, plot_risk_coverage, sweep_threshold
    from ..eval.preposition.status_task import QUESTION, collect_pairs, drawn_windows

    calib_w = drawn_windows(args.windows, seed=args.seed)  # each window drawn as the bar reaches it
    held_w = drawn_windows(args.windows, seed=args.seed + 1, exclude=calib_w)  # disjoint from the calibration set
    with contextlib.closing(_engine(args.model, args.dtype, args.threads)) as engine:
        with _bar("status windows", 2 * args.windows) as tick:
            calib = collect_pairs(engine, engine.tokenizer, calib_w, progress=tick)
            held = collect_pairs(engine, engine.tokenizer, held_w, progress=tick)
    exact = calibrate_held_out([p.exact_pair() for p in calib], [p.exact_pair() for p in held], r_max=args.r_max,
                               tau=args.tau)
    relaxed = calibrate_held_out([p.relaxed_pair() for p in calib], [p.relaxed_pair() for p in held],
                                 r_max=args.r_max, tau=args.tau)
    if plot is not None:
        plot_risk_coverage(sweep_threshold([p.exact_pair() for p in held]), str(plot),
                           title=f"status feed, {len(held)} held-out windows, model {args.model}", tau_marker=args.tau)
    out = {"model": args.model, "task": "status", "question": QUESTION, "exact": exact.as_dict(),
           "relaxed": relaxed.as_dict(), "held_out_accuracy": sum(p.label == p.truth for p in held) / len(held)}
    if args.json:
        print_json(out | _uncalibrated(out["exact"], "exact", _uncalibrated(out["relaxed"], "relaxed")), indent=2,
                   reasons=TAU_REASONS)
        return 0
    from ..eval.preposition.report import format_gate_point as point

    print(f"status feed: {len(calib)} calibration + {len(held)} held-out windows; held-out accuracy of the standing "
          f"query's token {out['held_out_accuracy']:.3f}")
    print(f"exact, τ for r ≤ {args.r_max} on calibration: {point(out['exact']['calibrated'])}")
    print(f"exact, held out at that τ: {point(out['exact']['held_out_at_calibrated'])}")
    print(f"exact, held out at τ = {args.tau:g}: {point(out['exact']['held_out_at_tau'])}")
    print(f"relaxed (Eq. 14), held out at τ = {args.tau:g}: {point(out['relaxed']['held_out_at_tau'])}")
    return 0


def _print_gate_report(rep: Any, pairs: list[Any], tok: Any) -> None:
    from ..eval.preposition.report import format_top_counts, format_trend_gate, top_counts

    print(f"{rep.n} windows, |A| = {rep.answer_set_size}; γ quantiles (10/50/90 %) "
          f"{', '.join(f'{q:.3f}' for q in rep.gap_quantiles)}; split: {rep.split}")
    for line in format_trend_gate(rep.as_dict()):
        print(line)
    print(f"agreement cached vs full path {rep.agreement:.3f}; accuracy vs ground truth: full path "
          f"{rep.full_accuracy:.3f}, cached token {rep.fast_accuracy:.3f}")
    print(f"cached tokens: {format_top_counts(top_counts([tok.decode([p.fast_token]) for p in pairs]))}; full-path tokens: "
          f"{format_top_counts(top_counts([tok.decode([p.full_token]) for p in pairs]))}")
