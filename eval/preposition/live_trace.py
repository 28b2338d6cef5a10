"""Live traces of `bench preposition` (HW-4): the streaming status feed at query-to-update ratios ρ, and
an agentic tool-calling session; both served un-forced by the gate (τ given or calibrated, never forced).

Streaming: Poisson updates (a status batch; a sliding window of 4 batches) and standing queries
("Latest status?" + "Status:") replayed in real time on a `status_task` session.  Measured per ρ:

    h        consumed / resolved pre-positions (Eq. 8), against ρ/(1+ρ) and e^{−d/I} ρ/(1+ρ)
    h_fast   pre-positions whose consuming queries were served by the gate (the un-forced fast path),
             against g e^{−d/I} ρ/(1+ρ) with g the held-out gate coverage at the trace's τ
    queries  paths taken, the fast share, and accuracy against the latest batch's status

Agentic: tool calls whose results repeat with known frequencies (a pump status, a note store) or never
(a weather service).  While each tool "runs", the session pre-positions the result envelope and the
realized entries of the results it saw before (`AgenticSession.predict_results`); measured: how often the
real result was pre-positioned, how often the gate then served the first token, and the latencies.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from ..harness.intervals import wilson_interval
from .latency_model import hit_rate, hit_rate_delayed, poisson_trace, replay_trace
from .status_task import LABELS, QUESTION, answer_tokens, batch_text, status_session
from ...programs.sessions import AgenticSession
from ...runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
from ...runtime_ext.preposition.gate import GateConfig

WINDOW_BATCHES = 4
TURN_ROOM = 256
"""Tokens an agentic turn may take (call, result entry, answer): the trace rolls its conversation back to the
first user message when fewer are left in the context window."""


def _rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson_interval(k, n)
    return {"k": k, "n": n, "rate": k / n if n else float("nan"), "ci95": [lo, hi]}


def run_status_trace(engine: Any, tokenizer: Any, rho: float, n_updates: int, interval_s: float, gate: GateConfig,
                     rng: np.random.Generator, *, tick: Callable[[], None] | None = None, delay_s: float = 0.0,
                     gate_coverage: float | None = None) -> dict[str, Any]:
    """One live trace at ρ (see the module docstring); `delay_s` (ingest + T_pp) and `gate_coverage` (g)
    only feed the closed forms reported beside the measurement."""
    A = answer_tokens(tokenizer)
    pp = Prepositioner(engine, PrepositionConfig(gate=gate), tokenizer=tokenizer)
    s = status_session(pp, tokenizer, allow_relaxed=False)  # one entry per update: the standing query's
    labels: list[str] = []
    lengths: list[int] = []
    served: list[tuple[str, int, bool]] = []

    def update() -> None:
        label = str(rng.choice(LABELS))
        if len(lengths) >= WINDOW_BATCHES:
            s.state.shift_window(lengths.pop(0))  # sliding window, part of this update (re-pre-positioned below)
        before = s.state.live_end
        s.append_data(batch_text(rng, label), preposition=bool(labels))
        if not labels:
            s.register_query("status", QUESTION)  # the first update pre-positions through the registration
        lengths.append(s.state.live_end - before)
        labels.append(label)
        if tick is not None:
            tick()

    def query() -> None:
        r = s.ask_standing("status")
        served.append((r.path, r.version, A.get(r.token_id) == labels[-1]))

    lag = replay_trace(poisson_trace(rho, n_updates, rng), update, query, interval_s)
    pp.wait_idle(120, session=s.state)
    c = pp.counters
    s.close()
    pp.close()
    return _trace_report(rho, c, served, lag, delay_s / interval_s, gate_coverage)


def status_update_cost(engine: Any, tokenizer: Any, rng: np.random.Generator, n: int = 8) -> float:
    """Median seconds of one trace update on the trace's own session (window shift, batch ingest, and its
    pre-position run to completion): the trace's d, and the base of its mean update interval (Eq. 7)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    pp = Prepositioner(engine, PrepositionConfig(gate=GateConfig(threshold=float("inf"))), tokenizer=tokenizer)
    s = status_session(pp, tokenizer, allow_relaxed=False)
    lengths: list[int] = []
    times: list[float] = []
    try:
        before = s.state.live_end
        s.append_data(batch_text(rng, str(rng.choice(LABELS))), preposition=False)
        lengths.append(s.state.live_end - before)
        s.register_query("status", QUESTION)  # the first update pre-positions through the registration
        pp.wait_idle(120, session=s.state)
        for i in range(WINDOW_BATCHES + n):  # the first WINDOW_BATCHES slide the window once (untimed)
            t0 = time.perf_counter()
            if len(lengths) >= WINDOW_BATCHES:
                s.state.shift_window(lengths.pop(0))
            before = s.state.live_end
            s.append_data(batch_text(rng, str(rng.choice(LABELS))))
            lengths.append(s.state.live_end - before)
            pp.wait_idle(120, session=s.state)
            if i >= WINDOW_BATCHES:
                times.append(time.perf_counter() - t0)
    finally:
        s.close()
        pp.close()
    return float(np.median(times))


def _trace_report(rho: float, c: Any, served: list[tuple[str, int, bool]], lag: float, delay: float,
                  g: float | None) -> dict[str, Any]:
    resolved = c.consumed + c.invalidated + c.discarded
    fast_versions = {v for p, v, _ in served if p == "fast"}
    paths: dict[str, int] = {}
    for p, _, _ in served:
        paths[p] = paths.get(p, 0) + 1
    fast_ok = [ok for p, _, ok in served if p == "fast"]
    delayed = float(hit_rate_delayed(rho, delay))
    return {
        "rho": rho, "closed_form_h": hit_rate(rho), "closed_form_h_delayed": delayed,
        "measured_h": c.hit_rate, "h_ci95": list(wilson_interval(c.consumed, resolved)),
        "h_fast": _rate(len(fast_versions), resolved),
        "closed_form_h_fast": None if g is None else g * delayed,
        "resolved_prepositions": resolved, "queries": len(served), "paths": paths,
        "fast_share_of_queries": _rate(len(fast_ok), len(served)),
        "fast_accuracy": _rate(sum(fast_ok), len(fast_ok)),
        "query_accuracy": _rate(sum(ok for _, _, ok in served), len(served)),
        "final_lag_s": lag, "counters": c.as_dict(),
    }


TOOLS: tuple[tuple[str, str, tuple[tuple[str, float], ...]], ...] = (
    ("pump_status", '{"name": "pump_status", "arguments": {"pump": "P1"}}', (("ok", 0.8), ("degraded", 0.2))),
    ("save_note", '{"name": "save_note", "arguments": {"text": "checked"}}', (("saved", 0.9), ("error: disk full", 0.1))),
    ("weather", '{"name": "weather", "arguments": {"city": "Paris"}}', ()),  # never repeats
)
"""(tool, call, result distribution); an empty distribution draws a fresh weather report every time."""


def _draw_result(rng: np.random.Generator, dist: tuple[tuple[str, float], ...]) -> str:
    if not dist:
        return f"{int(rng.integers(-5, 35))} C, {rng.choice(['sunny', 'cloudy', 'rain', 'wind'])}"
    names, probs = zip(*dist)
    return str(rng.choice(names, p=np.asarray(probs) / np.sum(probs)))


def run_agentic_trace(engine: Any, tokenizer: Any, n_turns: int, gate: GateConfig, rng: np.random.Generator, *,
                      tick: Callable[[], None] | None = None, answer_tokens_n: int = 4) -> dict[str, Any]:
    """`n_turns` tool calls on one agentic session; the tool's run is the idle window (waited out)."""
    pp = Prepositioner(engine, PrepositionConfig(gate=gate), tokenizer=tokenizer)
    a = AgenticSession(pp, tokenizer=tokenizer, predict_results=2)
    a.user("Check the pump, keep notes and watch the weather. Answer each tool result in a few words.")
    base = a.state.live_end
    rows = []
    for _ in range(n_turns):
        if a.state.max_len is not None and a.state.live_end + TURN_ROOM > a.state.max_len and a.state.live_end > base:
            a.rollback(a.state.live_end - base)  # keep the conversation inside the context window
        tool, call, dist = TOOLS[int(rng.integers(len(TOOLS)))]
        a.emit_tool_call(call)
        pp.wait_idle(120, session=a.state)  # the tool runs: the idle window
        turn = a.tool_result(_draw_result(rng, dist), max_new_tokens=answer_tokens_n)
        rows.append({"tool": tool, "predicted": turn.predicted, "path": turn.first.path,
                     "latency_ms": turn.first.latency_s * 1e3, "delta": turn.first.delta,
                     "gap": turn.first.logit_gap})
        if tick is not None:
            tick()
    c = pp.counters
    a.close()
    pp.close()
    return _agentic_report(rows, c, gate)


def _agentic_report(rows: list[dict[str, Any]], c: Any, gate: GateConfig) -> dict[str, Any]:
    predicted = [r for r in rows if r["predicted"]]
    fast = [r for r in rows if r["path"] == "fast"]

    def p50(xs: list[float]) -> float | None:
        return float(np.percentile(xs, 50)) if xs else None

    by_tool: dict[str, dict[str, int]] = {}
    for r in rows:
        t = by_tool.setdefault(r["tool"], {"turns": 0, "predicted": 0, "fast": 0})
        t["turns"] += 1
        t["predicted"] += r["predicted"]
        t["fast"] += r["path"] == "fast"
    return {
        "turns": len(rows), "tau": gate.threshold, "predicted": _rate(len(predicted), len(rows)),
        "gate_fired_when_predicted": _rate(len(fast), len(predicted)), "fast_share": _rate(len(fast), len(rows)),
        "p50_ms": {"fast": p50([r["latency_ms"] for r in fast]),
                   "fall_predicted": p50([r["latency_ms"] for r in predicted if r["path"] != "fast"]),
                   "fall_unpredicted": p50([r["latency_ms"] for r in rows if not r["predicted"]])},
        "mean_delta_unpredicted": float(np.mean([r["delta"] for r in rows if not r["predicted"]] or [np.nan])),
        "by_tool": by_tool, "counters": c.as_dict(), "tools": [list(t[:2]) for t in TOOLS],
    }
