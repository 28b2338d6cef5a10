"""`forerun session demo`, `forerun bench preposition` and `forerun calibrate gate`: pre-positioning commands.

    forerun session demo [--model tiny|default|PATH] [--tau T] [--json]
    forerun bench preposition [--model default] [--requests 128] [--trace-updates 32] [--rhos 0.25,1,4]
                              [--calib-windows 64] [--plots DIR] [--json]
    forerun calibrate gate [--model default] [--windows 128] [--tau 2.0] [--r-max 0.15] [--answer-lead TEXT]
                           [--plot PATH] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from typing import Any, Iterator

from .args import add_model_arguments, gate_threshold, nonnegative_int, positive_float, positive_int, thread_count
from .errors import CommandError, reports_errors
from .output import PLOT_SUFFIXES, make_output_dir, output_dir, output_file, print_json

__all__ = ["register", "session_demo_command", "bench_preposition_command", "calibrate_gate_command"]

TAU_REASONS = {"tau": "τ = inf: the gate never fires", "threshold": "τ = inf: the gate never fires"}


def _rhos(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
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


def register(subparsers: Any, bench_subparsers: Any) -> None:
    sess = subparsers.add_parser("session", help="stateful sessions with speculative pre-positioning")
    sess_sub = sess.add_subparsers(dest="session_command", required=True)
    d = sess_sub.add_parser("demo", help="a short streaming and agentic session: path and latency per request")
    d.add_argument("--tau", type=gate_threshold, default=2.0, help="gate threshold τ (default 2.0; inf: never fires)")
    _engine_arguments(d, default_model="tiny")
    d.set_defaults(handler=session_demo_command)

    b = bench_subparsers.add_parser("preposition", help="pre-positioning: L_cold / L_fast / L_fall, hit rate vs ρ, gate")
    b.add_argument("--requests", type=positive_int, default=128, help="requests per latency arm (128)")
    b.add_argument("--trace-updates", type=nonnegative_int, default=32, help="updates per ρ in the live trace (32; 0 skips)")
    b.add_argument("--trace-interval", type=positive_float, default=None,
                   help="mean update interval of the trace in seconds (default: --trace-idle-factor x measured "
                        "ingest + pre-position)")
    b.add_argument("--trace-idle-factor", type=positive_float, default=4.0,
                   help="mean update interval / (ingest + T_pp) when --trace-interval is not given (4)")
    b.add_argument("--rhos", type=_rhos, default=(0.25, 1.0, 4.0), help="query-to-update ratios (0.25,1,4)")
    b.add_argument("--calib-windows", type=nonnegative_int, default=64, help="trend windows for the gate (64; 0 skips)")
    b.add_argument("--tau", type=gate_threshold, default=2.0, help="gate threshold τ reported (2.0)")
    b.add_argument("--r-max", type=float, default=0.15, help="risk budget for the calibrated τ, in [0, 1] (0.15)")
    b.add_argument("--plots", default=None, help="directory for Figures 4-7 (PNG); its parent must exist")
    b.add_argument("--seed", type=nonnegative_int, default=0)
    _engine_arguments(b)
    b.set_defaults(handler=bench_preposition_command)

    cal = subparsers.add_parser("calibrate", help="calibration commands")
    cal_sub = cal.add_subparsers(dest="calibrate_command", required=True)
    g = cal_sub.add_parser("gate", help="sweep the pre-positioning gate τ on the streaming trend task")
    g.add_argument("--windows", type=positive_int, default=128, help="price windows (decision points), 128")
    g.add_argument("--window-len", type=_window_len, default=12, help="prices per window, >= 2 (12)")
    g.add_argument("--tau", type=gate_threshold, default=2.0, help="τ to report (2.0)")
    g.add_argument("--r-max", type=float, default=0.15, help="risk budget r_max, in [0, 1] (0.15)")
    g.add_argument("--answer-lead", default="", help="text appended to the assistant header, e.g. 'The trend is'")
    g.add_argument("--plot", default=None, help="write the risk-coverage figure (Figure 7) to this PNG/PDF/SVG")
    g.add_argument("--seed", type=nonnegative_int, default=0)
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
    from tqdm import tqdm

    with tqdm(total=total, desc=name, file=sys.stderr, leave=False, dynamic_ncols=True) as t:
        yield lambda: t.update(1)


# ------------------------------------------------------------------------------------------------
@reports_errors("session demo")
def session_demo_command(args: argparse.Namespace) -> int:
    from ..eval.trend_task import answer_tokens
    from ..runtime_ext.preposition.ready_cache import GateConfig

    gate = GateConfig(threshold=args.tau)  # validated before the model loads
    with contextlib.closing(_engine(args.model, args.dtype, args.threads)) as engine:
        tok = engine.tokenizer
        gate = GateConfig(threshold=gate.threshold, fast_answer_set=frozenset(answer_tokens(tok)))
        rows: list[dict[str, Any]] = []
        with _bar("session demo", 10) as tick:
            counters = {"streaming": _streaming_demo(engine, gate, rows, tick),
                        "agentic": _agentic_demo(engine, rows, tick)}
    if args.json:
        print_json({"model": args.model, "tau": args.tau, "requests": rows, "counters": counters}, indent=2,
                   reasons=TAU_REASONS)
        return 0
    print(f"{'session':<10} {'path':<13} {'ms':>9} {'γ':>7} {'Δ':>4}  request -> token")
    for r in rows:
        gap = "-" if r["logit_gap"] is None else f"{r['logit_gap']:.2f}"
        print(f"{r['session']:<10} {r['path']:<13} {r['latency_ms']:>9.3f} {gap:>7} {r['delta']:>4}  "
              f"{r['request']} -> {r['token']!r} {r['note']}")
    for name, c in counters.items():
        print(f"{name}: pre-positions run {c['installed']}, skipped {c['skipped']}, consumed {c['consumed']}, "
              f"invalidated {c['invalidated']}, discarded {c['discarded']}; fast {c['served_fast']}, "
              f"fast (relaxed) {c['served_fast_relaxed']}, fall-through {c['fell_through']}, cold {c['cold']}")
    return 0


def _demo_row(tok: Any, session: str, request: str, r: Any, note: str = "") -> dict[str, Any]:
    return {"session": session, "request": request, "path": r.path, "token": r.text or tok.decode([r.token_id]),
            "latency_ms": r.latency_s * 1e3, "logit_gap": r.logit_gap, "delta": r.delta,
            "cached_tokens": r.cached_tokens, "note": note}


def _streaming_demo(engine: Any, gate: Any, rows: list[dict[str, Any]], tick: Any) -> dict[str, Any]:
    """Three data batches on a streaming session with a standing query; returns the session counters."""
    from ..eval.trend_task import QUESTION, SYSTEM, make_windows
    from ..programs.sessions import StreamingSession
    from ..runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner

    tok = engine.tokenizer
    with Prepositioner(engine, PrepositionConfig(gate=gate), tokenizer=tok) as pp:
        with StreamingSession(pp, tokenizer=tok, system=SYSTEM) as s:
            s.register_query("trend", QUESTION)
            for i, w in enumerate(make_windows(3, seed=7)):
                r0 = s.ask_standing("trend")  # arrives before the update: whatever is pre-positioned
                rows.append(_demo_row(tok, "streaming", f"standing query before batch {i}", r0))
                s.append_data(w.text())
                pp.wait_idle(60)  # the idle window: the pre-position lands before the next query
                rows.append(_demo_row(tok, "streaming", f"standing query after batch {i} ({w.direction})",
                                      s.ask_standing("trend")))
                rows.append(_demo_row(tok, "streaming", "ad-hoc: 'Which way are prices moving?'",
                                      s.ask("Which way are prices moving?")))
                tick()
        return pp.counters.as_dict()  # after the session closed (it stays referenced: still counted)


def _agentic_demo(engine: Any, rows: list[dict[str, Any]], tick: Any) -> dict[str, Any]:
    """Two tool calls on an agentic session, the second with its expected result pre-positioned."""
    from ..programs.sessions import AgenticSession
    from ..runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
    from ..runtime_ext.preposition.ready_cache import GateConfig

    tok = engine.tokenizer
    # a permissive gate so the fast path is visible even on a small model
    with Prepositioner(engine, PrepositionConfig(gate=GateConfig(threshold=-1.0)), tokenizer=tok) as pp:
        with AgenticSession(pp, tokenizer=tok) as a:
            a.user("What is the weather in Paris? Use the weather tool.")
            a.emit_tool_call('{"name": "weather", "arguments": {"city": "Paris"}}')
            pp.wait_idle(60)
            t1 = a.tool_result("sunny, 21 C", max_new_tokens=8)
            rows.append(_demo_row(tok, "agentic", "tool_result('sunny, 21 C')", t1.first, f"turn: {t1.text!r}"))
            a.emit_tool_call('{"name": "save_note", "arguments": {"text": "sunny"}}', expected_result="ok")
            pp.wait_idle(60)
            t2 = a.tool_result("ok", max_new_tokens=8)
            rows.append(_demo_row(tok, "agentic", "tool_result('ok') (expected result pre-positioned; gate τ=-1)",
                                  t2.first, f"turn: {t2.text!r}"))
            tick()
        return pp.counters.as_dict()


@reports_errors("bench preposition")
def bench_preposition_command(args: argparse.Namespace) -> int:
    _check_r_max(args.r_max)
    plots = output_dir(args.plots, "--plots")
    from ..eval.bench_preposition import BenchConfig, format_report, run_bench

    cfg = BenchConfig(requests=args.requests, trace_updates=args.trace_updates, rhos=args.rhos,
                      trace_interval_s=args.trace_interval, trace_idle_factor=args.trace_idle_factor,
                      calib_windows=args.calib_windows, tau=args.tau, r_max=args.r_max, seed=args.seed)
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
    plot = output_file(args.plot, "--plot", suffixes=PLOT_SUFFIXES)
    from ..eval.calibration import plot_risk_coverage
    from ..eval.trend_task import answer_tokens, collect_pairs, make_windows, report

    windows = make_windows(args.windows, args.window_len, seed=args.seed)
    with contextlib.closing(_engine(args.model, args.dtype, args.threads)) as engine:
        tok = engine.tokenizer
        with _bar("trend windows", len(windows)) as tick:
            pairs = collect_pairs(engine, tok, windows, progress=tick, answer_lead=args.answer_lead)
    rep, points = report(pairs, tau=args.tau, r_max=args.r_max, answer_set_size=len(answer_tokens(tok)))
    if plot is not None:
        plot_risk_coverage(points, str(plot), title=f"trend task, {len(pairs)} windows, model {args.model}")
    if args.json:
        print_json({"model": args.model, "answer_lead": args.answer_lead, "report": rep.as_dict(),
                    "sweep": [p.as_dict() for p in points]}, indent=2, reasons=TAU_REASONS)
        return 0
    _print_gate_report(rep, pairs, tok)
    return 0


def _print_gate_report(rep: Any, pairs: list[Any], tok: Any) -> None:
    from ..eval.trend_task import _top_counts_text

    at = rep.at_tau
    print(f"{rep.n} windows, |A| = {rep.answer_set_size}; γ quantiles (10/50/90 %) "
          f"{', '.join(f'{q:.3f}' for q in rep.gap_quantiles)}")
    print(f"τ = {at.threshold:g}: coverage {at.coverage:.3f} [{at.coverage_ci[0]:.3f}, {at.coverage_ci[1]:.3f}], "
          f"false accept {at.false_accept:.3f} [{at.false_accept_ci[0]:.3f}, {at.false_accept_ci[1]:.3f}] "
          f"({at.accepted} accepted, {at.wrong} wrong)")
    cal = rep.calibrated
    print(f"smallest τ with r(τ) ≤ {rep.r_max}: " + ("none" if cal is None else
          f"{cal.threshold:.3f} (coverage {cal.coverage:.3f}, false accept {cal.false_accept:.3f})"))
    print(f"agreement cached vs full path {rep.agreement:.3f}; accuracy vs ground truth: full path "
          f"{rep.full_accuracy:.3f}, cached token {rep.fast_accuracy:.3f}")
    print(f"cached tokens: {_top_counts_text([tok.decode([p.fast_token]) for p in pairs])}; full-path tokens: "
          f"{_top_counts_text([tok.decode([p.full_token]) for p in pairs])}")
