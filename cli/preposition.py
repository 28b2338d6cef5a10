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
import json
import sys
import time
from typing import Any, Iterator

from .args import add_model_arguments, nonnegative_int, positive_int

__all__ = ["register", "session_demo_command", "bench_preposition_command", "calibrate_gate_command"]


def _rhos(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"every ρ must be > 0, got {text!r}")
    return vals


def register(subparsers: Any, bench_subparsers: Any) -> None:
    sess = subparsers.add_parser("session", help="stateful sessions with speculative pre-positioning")
    sess_sub = sess.add_subparsers(dest="session_command", required=True)
    d = sess_sub.add_parser("demo", help="a short streaming and agentic session: path and latency per request")
    add_model_arguments(d, default="tiny")
    d.add_argument("--tau", type=float, default=2.0, help="gate threshold τ (default 2.0)")
    d.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    d.add_argument("--json", action="store_true", help="print a JSON object on stdout")
    d.set_defaults(handler=session_demo_command)

    b = bench_subparsers.add_parser("preposition", help="pre-positioning: L_cold / L_fast / L_fall, hit rate vs ρ, gate")
    add_model_arguments(b)
    b.add_argument("--requests", type=positive_int, default=128, help="requests per latency arm (128)")
    b.add_argument("--trace-updates", type=nonnegative_int, default=32, help="updates per ρ in the live trace (32; 0 skips)")
    b.add_argument("--trace-interval", type=float, default=None,
                   help="mean update interval of the trace in seconds (default: --trace-idle-factor x measured "
                        "ingest + pre-position)")
    b.add_argument("--trace-idle-factor", type=float, default=4.0,
                   help="mean update interval / (ingest + T_pp) when --trace-interval is not given (4)")
    b.add_argument("--rhos", type=_rhos, default=(0.25, 1.0, 4.0), help="query-to-update ratios (0.25,1,4)")
    b.add_argument("--calib-windows", type=nonnegative_int, default=64, help="trend windows for the gate (64; 0 skips)")
    b.add_argument("--tau", type=float, default=2.0, help="gate threshold τ reported (2.0)")
    b.add_argument("--r-max", type=float, default=0.15, help="risk budget for the calibrated τ (0.15)")
    b.add_argument("--plots", default=None, help="directory for Figures 4-7 (PNG)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    b.add_argument("--json", action="store_true", help="print a JSON object on stdout")
    b.set_defaults(handler=bench_preposition_command)

    cal = subparsers.add_parser("calibrate", help="calibration commands")
    cal_sub = cal.add_subparsers(dest="calibrate_command", required=True)
    g = cal_sub.add_parser("gate", help="sweep the pre-positioning gate τ on the streaming trend task")
    add_model_arguments(g)
    g.add_argument("--windows", type=positive_int, default=128, help="price windows (decision points), 128")
    g.add_argument("--window-len", type=positive_int, default=12, help="prices per window (12)")
    g.add_argument("--tau", type=float, default=2.0, help="τ to report (2.0)")
    g.add_argument("--r-max", type=float, default=0.15, help="risk budget r_max (0.15)")
    g.add_argument("--answer-lead", default="", help="text appended to the assistant header, e.g. 'The trend is'")
    g.add_argument("--plot", default=None, help="write the risk-coverage figure (Figure 7) to this PNG")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    g.add_argument("--json", action="store_true", help="print a JSON object on stdout")
    g.set_defaults(handler=calibrate_gate_command)


# ------------------------------------------------------------------------------------------------
def _engine(model: str, dtype: str | None, threads: int | None = None) -> Any:
    from ..runtime_ext.engine import EngineConfig
    from ..runtime_ext.protocol import SamplingParams
    from ..runtime_ext.runtime import open_runtime

    # single-session latency: no gathering window in front of each request
    engine = open_runtime(model, dtype, engine_config=EngineConfig(batch_window_ms=0.0, num_threads=threads)).engine
    warm = list(engine.tokenizer.encode("warm up the engine", add_special_tokens=False)) or [1]
    engine.generate(warm, SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True))  # first-call costs
    engine.flush_cache()
    return engine


@contextlib.contextmanager
def _bar(name: str, total: int) -> Iterator[Any]:
    from tqdm import tqdm

    with tqdm(total=total, desc=name, file=sys.stderr, leave=False, dynamic_ncols=True) as t:
        yield lambda: t.update(1)


def _fail(cmd: str, exc: BaseException) -> int:
    print(f"forerun {cmd}: {exc}", file=sys.stderr)
    return 2


# ------------------------------------------------------------------------------------------------
def session_demo_command(args: argparse.Namespace) -> int:
    from ..eval.trend_task import QUESTION, SYSTEM, answer_tokens, make_windows
    from ..programs.sessions import AgenticSession, StreamingSession
    from ..runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
    from ..runtime_ext.preposition.ready_cache import GateConfig

    try:
        engine = _engine(args.model, args.dtype, args.threads)
    except (ValueError, OSError) as exc:
        return _fail("session demo", exc)
    tok = engine.tokenizer
    rows: list[dict[str, Any]] = []

    def record(session: str, request: str, r: Any, extra: str = "") -> None:
        rows.append({"session": session, "request": request, "path": r.path, "token": r.text or tok.decode([r.token_id]),
                     "latency_ms": r.latency_s * 1e3, "logit_gap": r.logit_gap, "delta": r.delta,
                     "cached_tokens": r.cached_tokens, "note": extra})

    gate = GateConfig(threshold=args.tau, fast_answer_set=frozenset(answer_tokens(tok)))
    try:
        with Prepositioner(engine, PrepositionConfig(gate=gate), tokenizer=tok) as pp:
            s = StreamingSession(pp, tokenizer=tok, system=SYSTEM)
            s.register_query("trend", QUESTION)
            with _bar("session demo", 9) as tick:
                for i, w in enumerate(make_windows(3, seed=7)):
                    r0 = s.ask_standing("trend")  # arrives before the update: whatever is pre-positioned
                    record("streaming", f"standing query before batch {i}", r0)
                    s.append_data(w.text())
                    pp.wait_idle(60)  # the idle window: the pre-position lands before the next query
                    record("streaming", f"standing query after batch {i} ({w.direction})", s.ask_standing("trend"))
                    record("streaming", "ad-hoc: 'Which way are prices moving?'", s.ask("Which way are prices moving?"))
                    tick()
                s.close()
            # a permissive gate so the fast path is visible even on a small model
            with Prepositioner(engine, PrepositionConfig(gate=GateConfig(threshold=-1.0)), tokenizer=tok) as pp2:
                a = AgenticSession(pp2, tokenizer=tok)
                a.user("What is the weather in Paris? Use the weather tool.")
                a.emit_tool_call('{"name": "weather", "arguments": {"city": "Paris"}}')
                pp2.wait_idle(60)
                t1 = a.tool_result("sunny, 21 C", max_new_tokens=8)
                record("agentic", "tool_result('sunny, 21 C')", t1.first, f"turn: {t1.text!r}")
                a.emit_tool_call('{"name": "save_note", "arguments": {"text": "sunny"}}', expected_result="ok")
                pp2.wait_idle(60)
                t2 = a.tool_result("ok", max_new_tokens=8)
                record("agentic", "tool_result('ok') (expected result pre-positioned; gate τ=-1)", t2.first,
                       f"turn: {t2.text!r}")
                a.close()
                counters = {"streaming": pp.counters.as_dict(), "agentic": pp2.counters.as_dict()}
    finally:
        engine.close()
    if args.json:
        print(json.dumps({"model": args.model, "tau": args.tau, "requests": rows, "counters": counters}, indent=2))
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


def bench_preposition_command(args: argparse.Namespace) -> int:
    import os

    from ..eval.bench_preposition import BenchConfig, format_report, run_bench

    try:
        cfg = BenchConfig(requests=args.requests, trace_updates=args.trace_updates, rhos=args.rhos,
                          trace_interval_s=args.trace_interval, trace_idle_factor=args.trace_idle_factor,
                          calib_windows=args.calib_windows, tau=args.tau,
                          r_max=args.r_max, seed=args.seed)
        engine = _engine(args.model, args.dtype, args.threads)
    except (ValueError, OSError) as exc:
        return _fail("bench preposition", exc)
    if args.plots:
        os.makedirs(args.plots, exist_ok=True)
    t0 = time.perf_counter()
    try:
        res = run_bench(engine, engine.tokenizer, cfg, progress=_bar, plots_dir=args.plots)
    finally:
        engine.close()
    res["model"] = args.model
    res["wall_s"] = time.perf_counter() - t0
    if args.json:
        print(json.dumps(res, indent=2, default=float))
    else:
        print(f"model {args.model}; {cfg.requests} requests per arm; wall {res['wall_s']:.0f} s")
        print(format_report(res))
    return 0


def calibrate_gate_command(args: argparse.Namespace) -> int:
    from ..eval.calibration import plot_risk_coverage
    from ..eval.trend_task import answer_tokens, collect_pairs, make_windows, report

    if not 0 <= args.r_max <= 1:
        return _fail("calibrate gate", ValueError(f"--r-max must be in [0, 1], got {args.r_max}"))
    try:
        engine = _engine(args.model, args.dtype, args.threads)
    except (ValueError, OSError) as exc:
        return _fail("calibrate gate", exc)
    tok = engine.tokenizer
    windows = make_windows(args.windows, args.window_len, seed=args.seed)
    try:
        with _bar("trend windows", len(windows)) as tick:
            pairs = collect_pairs(engine, tok, windows, progress=tick, answer_lead=args.answer_lead)
    finally:
        engine.close()
    rep, points = report(pairs, tau=args.tau, r_max=args.r_max, answer_set_size=len(answer_tokens(tok)))
    if args.plot:
        plot_risk_coverage(points, args.plot, title=f"trend task, {len(pairs)} windows, model {args.model}")
    if args.json:
        print(json.dumps({"model": args.model, "answer_lead": args.answer_lead, "report": rep.as_dict(),
                          "sweep": [p.as_dict() for p in points]},
                         indent=2, default=float))
        return 0
    at = rep.at_tau
    from ..eval.trend_task import _top_counts_text

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
    return 0
