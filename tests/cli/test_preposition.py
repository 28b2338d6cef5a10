"""`forerun session demo`, `forerun bench preposition`, `forerun calibrate gate` on a fast fake engine."""

from __future__ import annotations

import contextlib
import hashlib
import json

import numpy as np
import pytest

from forerun.cli import main as cli, preposition as cli_preposition
from forerun.runtime_ext.protocol import GenerateOutput
from forerun.runtime_ext.standin.server import byte_tokenizer

V = 258


def logits_of(ids):
    d = hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(d, "little")).normal(size=V) * 3


class FakeEngine:
    """Deterministic stand-in with the embedded engine's surface (generate, logits, pin, close)."""

    vocab_size = V

    def __init__(self):
        self.tokenizer = byte_tokenizer()
        self.pins = {}
        self.closed = False

    def generate(self, input_ids, params, *, rid=None, priority=0):
        seq = list(input_ids)
        out, meta = [], {"cached_tokens": 0}
        for i in range(params.max_new_tokens):
            z = logits_of(seq)
            if i == 0 and params.top_logprobs_num:
                lp = z - np.logaddexp.reduce(z)
                top = np.argsort(-lp)[: params.top_logprobs_num]
                meta["output_top_logprobs"] = [[[float(lp[j]), int(j), None] for j in top]]
            out.append(int(np.argmax(z)))
            seq.append(out[-1])
        return GenerateOutput(tuple(input_ids), tuple(out), self.tokenizer.decode(out), meta)

    def next_token_logits(self, ids):
        return logits_of(list(ids))

    def pin(self, ids):
        h = len(self.pins) + 1 + sum(self.pins)
        self.pins[h] = tuple(ids)
        return h

    def unpin(self, h):
        del self.pins[h]

    def close(self):
        self.closed = True


@pytest.fixture()
def fake(monkeypatch):
    engines = []

    def make(model, dtype, threads=None):
        if model.endswith("missing"):
            raise ValueError("unknown model 'missing'")
        engines.append(FakeEngine())
        return engines[-1]

    monkeypatch.setattr(cli_preposition, "_engine", make)
    return engines


def test_commands_registered():
    p = cli.build_parser()
    assert p.parse_args(["session", "demo"]).handler is cli_preposition.session_demo_command
    assert p.parse_args(["bench", "preposition", "--rhos", "1,4"]).rhos == (1.0, 4.0)
    assert p.parse_args(["calibrate", "gate"]).handler is cli_preposition.calibrate_gate_command
    with pytest.raises(SystemExit):
        p.parse_args(["bench", "preposition", "--rhos", "0"])


@pytest.fixture()
def bars(monkeypatch):
    """Record every progress bar's declared total and its ticks."""
    seen = []

    @contextlib.contextmanager
    def bar(name, total):
        seen.append([name, total, 0])

        def tick():
            seen[-1][2] += 1

        yield tick

    monkeypatch.setattr(cli_preposition, "_bar", bar)
    return seen


@pytest.mark.parametrize("tau", ["0", "2"])
def test_session_demo_json(fake, bars, capsys, tau):
    assert cli.main(["session", "demo", "--json", "--tau", tau]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["requests"]
    assert all(r["latency_ms"] >= 0 for r in rows) and len(rows) == 12
    for r in rows:  # the γ column and the explanation agree with the path
        if r["path"].startswith("fast"):
            assert "gate fired" in r["reason"] and r["logit_gap"] > float(tau)
        elif r["logit_gap"] is not None:
            assert "gate not met" in r["reason"]
        if r["path"] == "cold":
            assert r["logit_gap"] is None and "no valid pre-position" in r["reason"]
    agentic = [r for r in rows if r["session"] == "agentic"]
    assert agentic[0]["path"] == "fall" and "not seen before" in agentic[0]["request"]
    assert all("pre-positioned from history" in r["request"] and r["delta"] == 0 for r in agentic[1:])
    adhoc = [r for r in rows if r["request"].startswith("ad-hoc")]
    assert adhoc and all("relaxed" in r["reason"] for r in adhoc)  # the header's distribution, never the query's
    if tau == "0":
        assert {"fall", "fast"} <= {r["path"] for r in rows}
    assert bars == [["session demo", 12, 12]]  # the bar's total is what it ticks
    assert fake[0].closed and fake[0].pins == {}  # sessions released their pinned state and pre-paid entries


def test_session_demo_text_and_bad_model(fake, capsys, tmp_path):
    assert cli.main(["session", "demo"]) == 0
    assert "streaming" in capsys.readouterr().out
    assert cli.main(["session", "demo", "--model", "missing"]) == 2  # no such path: refused before any engine
    assert "model path 'missing' does not exist" in capsys.readouterr().err and len(fake) == 1
    (tmp_path / "missing").mkdir()
    assert cli.main(["session", "demo", "--model", str(tmp_path / "missing")]) == 2  # the loader's refusal
    assert "unknown model" in capsys.readouterr().err


def test_bench_preposition_small(fake, capsys, tmp_path):
    args = ["bench", "preposition", "--requests", "3", "--trace-updates", "6", "--trace-interval", "0.002",
            "--calib-windows", "4", "--status-windows", "4", "--agentic-turns", "3", "--energy-iterations", "0",
            "--tau", "auto", "--plots", str(tmp_path), "--json"]
    assert cli.main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert fake[0].pins == {}  # every state and pre-paid entry pinned by the bench was released
    lat = res["latency"]
    assert set(lat) == {"cold", "fast", "fall_0", "fall_entry"} and all(v["n"] == 3 for v in lat.values())
    assert lat["fast"]["mean_delta"] == 0 and lat["fall_0"]["mean_delta"] == 0
    assert lat["cold"]["mean_delta"] == res["entry_len"]
    assert [p["rho"] for p in res["trace"]["points"]] == [0.25, 1.0, 4.0]
    assert res["gate"]["n"] == 4 and "cold_over_fast_p50" in res["ratios"]
    auto = res["status_gate"]["exact"]["auto_tau"]
    assert res["live_tau"] == auto and res["trace"]["tau"] == auto and res["config"]["tau"] == "auto"
    point = res["trace"]["points"][0]
    assert {"h_fast", "fast_share_of_queries", "closed_form_h_fast", "fast_accuracy"} <= set(point)
    assert res["agentic"]["turns"] == 3 and res["agentic"]["tau"] == auto
    assert res["energy"]["available"] is False and "unavailable" in res["energy"]["reason"] or res["energy"]["available"]
    assert {f.name for f in tmp_path.iterdir()} >= {"fig4_latency_vs_entry.png", "fig5_cost_anatomy.png",
                                                    "fig6_amortization.png", "fig7_risk_coverage.png"}
    assert cli.main(args[:-1]) == 0  # text report
    assert "L_cold / L_fast" in capsys.readouterr().out


def test_bench_rejects_bad_tau(fake, capsys):
    for bad in ("-1", "nan", "often"):
        with pytest.raises(SystemExit):
            cli.main(["bench", "preposition", "--tau", bad])
    assert cli.main(["bench", "preposition", "--tau", "auto", "--status-windows", "0"]) == 2
    assert "needs the status calibration (--status-windows > 0)" in capsys.readouterr().err  # the flag, not the field
    assert fake == []  # rejected before any model loaded


def test_calibrate_gate(fake, capsys, tmp_path):
    assert cli.main(["calibrate", "gate", "--windows", "5", "--plot", str(tmp_path / "f7.png"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["report"]["n"] == 5 and out["sweep"] and (tmp_path / "f7.png").exists()
    assert cli.main(["calibrate", "gate", "--windows", "3", "--r-max", "2"]) == 2


def test_calibrate_gate_status_task_held_out(fake, capsys):
    assert cli.main(["calibrate", "gate", "--task", "status", "--windows", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["task"] == "status" and out["exact"]["held_out_at_tau"]["n"] == 4
    assert cli.main(["calibrate", "gate", "--task", "status", "--windows", "3"]) == 0
    assert "held out at" in capsys.readouterr().out


def test_calibrate_gate_refuses_trend_options_with_the_status_task(fake, capsys):
    """--window-len and --answer-lead shape the trend task's windows and header only; with --task status they used
    to be ignored silently.  Now one line, exit 2, before any model loads; the trend task still takes them."""
    for option, value in (("--window-len", "20"), ("--answer-lead", "The status is")):
        assert cli.main(["calibrate", "gate", "--task", "status", "--windows", "3", option, value]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{option} applies only with --task trend" in err
    assert fake == []
    assert cli.main(["calibrate", "gate", "--windows", "3", "--window-len", "5", "--answer-lead", "The trend is",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["answer_lead"] == "The trend is"


@pytest.mark.slow
def test_session_demo_default_model(capsys):
    """On SmolLM2 the status feed's standing query clears τ = 2 on 'up' batches (un-forced gate)."""
    assert cli.main(["session", "demo", "--model", "default", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any(r["path"] == "fast" for r in out["requests"])


def test_figure7_marks_the_reported_tau(fake, capsys, tmp_path, monkeypatch):
    """Figure 7's τ line is the τ the report is at (--tau), not the paper's 2.0, in both commands."""
    from forerun.eval.preposition import bench, calibration

    marks = []

    def record(points, path, *, title="", tau_marker=2.0):
        marks.append(tau_marker)
        return path

    monkeypatch.setattr(calibration, "plot_risk_coverage", record)
    monkeypatch.setattr(bench, "plot_risk_coverage", record)
    assert cli.main(["calibrate", "gate", "--windows", "3", "--tau", "3.5", "--plot", str(tmp_path / "f7.png")]) == 0
    assert cli.main(["bench", "preposition", "--requests", "1", "--trace-updates", "0", "--calib-windows", "2",
                     "--status-windows", "0", "--agentic-turns", "0", "--energy-iterations", "0", "--tau", "0.5",
                     "--plots", str(tmp_path / "figs"), "--json"]) == 0
    capsys.readouterr()
    assert marks == [3.5, 0.5]


def test_calibrate_gate_status_held_out_disjoint(fake, capsys, monkeypatch):
    """The held-out windows never repeat a calibration window (seed 0, 64 windows: the two seeds' draws share one)."""
    from forerun.eval.preposition import status_task

    seen = []

    def pairs(engine, tok, windows, *, progress=None):
        seen.append(list(windows))
        return [status_task.StatusPair(w.truth, 3.0, 0, 3.0, 0, 0, w.truth, None) for w in windows]

    monkeypatch.setattr(status_task, "collect_pairs", pairs)
    assert cli.main(["calibrate", "gate", "--task", "status", "--windows", "64", "--seed", "0", "--json"]) == 0
    capsys.readouterr()
    calib, held = seen
    assert len(calib) == len(held) == 64 and not set(calib) & set(held)


def test_bench_trace_interval_from_the_trace_sessions_update_cost(fake, capsys, monkeypatch):
    """The live trace's d and mean update interval come from an update of the trace's own session (few-shot
    history, 4-batch window), not from the latency arms' short state: on the tiny model an arm update cost
    ~9 ms against ~58 ms on the trace's session, so the trace ran with Eq. 7 violated (interval 35 ms)."""
    from forerun.eval.preposition import bench, live_trace

    eng = FakeEngine()
    assert live_trace.status_update_cost(eng, eng.tokenizer, np.random.default_rng(0), n=2) > 0 and eng.pins == {}
    monkeypatch.setattr(bench, "status_update_cost", lambda engine, tok, rng: 0.0123)
    assert cli.main(["bench", "preposition", "--requests", "1", "--trace-updates", "2", "--rhos", "1",
                     "--trace-idle-factor", "2", "--calib-windows", "0", "--status-windows", "0", "--agentic-turns",
                     "0", "--energy-iterations", "0", "--json"]) == 0
    tr = json.loads(capsys.readouterr().out)["trace"]
    assert tr["update_cost_s"] == 0.0123 and tr["interval_s"] == pytest.approx(0.0246)
    assert tr["points"][0]["closed_form_h_delayed"] == pytest.approx(np.exp(-0.5) * 0.5)


def test_bench_closed_form_fall_entry_at_the_measured_delta(fake, capsys):
    """L_fall(Δ) of the fall_entry arm is evaluated at that arm's Δ (its realized query's length), not at
    the cold arm's L_entry (byte tokenizer: Δ 82 against L_entry 74)."""
    assert cli.main(["bench", "preposition", "--requests", "2", "--trace-updates", "0", "--calib-windows", "0",
                     "--status-windows", "0", "--agentic-turns", "0", "--energy-iterations", "0", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    c, delta = res["constants"], res["latency"]["fall_entry"]["mean_delta"]
    assert delta != res["entry_len"]
    expected = c["restore_ms"] + c["prefill_ms_per_token"] * delta + c["decode_ms"]
    assert res["closed_form"]["l_fall_entry_ms"] == pytest.approx(expected)


def test_calibrate_gate_trend_judges_the_picked_tau_on_held_out_windows(fake, capsys, monkeypatch):
    """τ for --r-max is picked on windows 0, 2, 4 and judged on 1, 3, 5.  The fake makes every calibration
    window right and every held-out one wrong: an in-sample report read false accept 0 at the picked τ."""
    from forerun.eval.preposition import trend_task

    seen = []

    def pairs(engine, tok, windows, *, progress=None, answer_lead=""):
        seen.append(list(windows))
        return [trend_task.TrendPair(3.0 + i, ord("u"), True, ord("u") if i % 2 == 0 else ord("d"), w.direction,
                                     "up", "up") for i, w in enumerate(windows)]

    monkeypatch.setattr(trend_task, "collect_pairs", pairs)
    assert cli.main(["calibrate", "gate", "--windows", "6", "--r-max", "0.05", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)["report"]
    assert len(seen[0]) == 6 and (rep["calibration_windows"], rep["held_out_windows"]) == (3, 3)
    cal = rep["calibration"]
    assert cal["calibrated"]["n"] == 3 and cal["calibrated"]["false_accept"] == 0.0
    assert cal["held_out_at_calibrated"]["n"] == 3 and cal["held_out_at_calibrated"]["false_accept"] == 1.0
    assert rep["at_tau"]["n"] == 6 and "calibrated" not in rep
    assert cli.main(["calibrate", "gate", "--windows", "6", "--r-max", "0.05"]) == 0
    text = capsys.readouterr().out
    assert "picked on the 3 calibration windows" in text and "smallest τ with r(τ)" not in text
    held_line = next(line for line in text.splitlines() if line.startswith("held out (3 other windows)"))
    assert "false accept 1.000" in held_line and "3 accepted, 3 wrong" in held_line
    assert "reference τ on all 6 windows" in text


def test_calibrate_gate_trend_needs_two_windows(fake, capsys):
    assert cli.main(["calibrate", "gate", "--windows", "1"]) == 2
    assert "--windows must be >= 2 with --task trend" in capsys.readouterr().err and fake == []
    assert cli.main(["bench", "preposition", "--calib-windows", "1"]) == 2
    assert "--calib-windows must be 0 (skip) or >= 2" in capsys.readouterr().err and fake == []  # the flag typed


def test_bench_without_status_calibration_reports_g_as_unmeasured(fake, capsys, tmp_path):
    """--status-windows 0: g was never measured, so it is null with the reason (it read 0.0, as if measured),
    E[L_pp] is not computed, the trace's g·h prediction is null, and Figure 6 is still drawn."""
    from forerun.eval.preposition.report import format_report

    assert cli.main(["bench", "preposition", "--requests", "1", "--trace-updates", "2", "--rhos", "1",
                     "--trace-interval", "0.002", "--calib-windows", "4", "--status-windows", "0",
                     "--agentic-turns", "0", "--energy-iterations", "0", "--plots", str(tmp_path), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["gate_fire_probability_g"] is None and "not measured" in res["gate_fire_probability_g_source"]
    assert res["expected_latency_ms"] is None
    assert res["trace"]["gate_coverage_g"] is None and res["trace"]["points"][0]["closed_form_h_fast"] is None
    assert (tmp_path / "fig6_amortization.png").stat().st_size > 1000
    text = format_report(res)  # also after the strict-JSON round trip
    assert "g = 0" not in text and "E[L_pp] (Eq. 9): not computed, g not measured" in text
    assert "g not measured" in text.split("live trace")[1]
    assert "held out (2 other windows) at that τ" in text  # the bench's trend section: τ judged on held-out windows
    assert res["gate"]["calibration"]["held_out_at_tau"]["n"] == 2


class _Stop(Exception):
    pass


@contextlib.contextmanager
def _within(seconds):
    """The block must end within `seconds` (SIGALRM raises _Stop, which the command reports as an internal error)."""
    import signal

    def ring(signum, frame):
        raise _Stop(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_calibrate_gate_refuses_a_window_longer_than_the_context(monkeypatch, capsys):
    """--window-len 1e14 drew the windows whole before the model loaded: an internal error (MemoryError, exit 1)
    after seconds; a window longer than the model's context window cannot fit it (each price is one token or more):
    one line naming --window-len and the context, exit 2."""
    from types import SimpleNamespace

    class SmallContext(FakeEngine):
        model_info = SimpleNamespace(max_context=64)

    monkeypatch.setattr(cli_preposition, "_engine", lambda model, dtype, threads=None: SmallContext())
    for length in (10**14, 65):
        with _within(60):
            assert cli.main(["calibrate", "gate", "--windows", "2", "--window-len", str(length)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--window-len {length}: " in err and "context window of 64 tokens" in err


@pytest.mark.parametrize("task", ["trend", "status"])
def test_calibrate_gate_draws_each_window_as_the_run_reaches_it(fake, monkeypatch, capsys, task):
    """--windows 1e14 drew every window before the model loaded, with no progress bar (hours, and memory without
    bound); now the run starts at once and each window is drawn when it is reached: the same windows, in order."""
    from forerun.eval.preposition import status_task, trend_task

    module = trend_task if task == "trend" else status_task
    want = (trend_task.make_windows(3, 12, seed=0) if task == "trend" else status_task.make_windows(3, seed=0))
    seen = []

    def first_three(engine, tokenizer, windows, **kwargs):
        seen.extend(w for _, w in zip(range(3), windows))
        raise ValueError("stopped after three windows")

    monkeypatch.setattr(module, "collect_pairs", first_three)
    with _within(60):
        assert cli.main(["calibrate", "gate", "--task", task, "--windows", str(10**14)]) == 2
    assert "stopped after three windows" in capsys.readouterr().err
    assert seen == want and len(fake) == 1
