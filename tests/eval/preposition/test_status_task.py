"""The status-feed task and the live traces on fake engines whose answers are known in closed form."""

from __future__ import annotations

import re

import numpy as np
import pytest

from forerun.eval.preposition import status_task
from forerun.eval.preposition.calibration import calibrate_held_out
from forerun.eval.preposition.live_trace import run_agentic_trace, run_status_trace
from forerun.runtime_ext.preposition.gate import GateConfig
from forerun.runtime_ext.protocol import GenerateOutput
from forerun.runtime_ext.standin.server import byte_tokenizer

TOK = byte_tokenizer()


class StatusEngine:
    """Reads the latest status in the text.  With the question in context it answers that status with
    γ = 3 when it is "up" and the wrong word with γ = 0.5 when it is "down"; from the header alone it
    answers "u" with γ = 1."""

    tokenizer = TOK
    vocab_size = 258

    def __init__(self):
        self.calls = 0

    def generate(self, input_ids, params, *, rid=None, priority=0):
        self.calls += 1
        text = TOK.decode(input_ids)
        latest = re.findall(r"status=(up|down)", text)[-1]
        logits = np.zeros(258)
        if status_task.QUESTION in text.rsplit("status=", 1)[1]:  # the standing query after the latest batch
            logits[ord("u")] = 3.0 if latest == "up" else 0.5
        else:
            logits[ord("u")] = 1.0
        lp = logits - np.logaddexp.reduce(logits)
        top = np.argsort(-lp, kind="stable")[: max(params.top_logprobs_num, 2)]
        meta = {"output_top_logprobs": [[[float(lp[i]), int(i), None] for i in top]], "cached_tokens": 0}
        out = tuple([int(top[0])] * max(params.max_new_tokens, 1))
        return GenerateOutput(tuple(input_ids), out, TOK.decode(list(out)), meta)


def test_windows_examples_and_answer_set():
    ws = status_task.make_windows(50, seed=3)
    assert ws == status_task.make_windows(50, seed=3)
    assert {w.truth for w in ws} == {"up", "down"} and all(1 <= len(w.batches) <= 4 for w in ws)
    assert all(w.batches[-1].endswith(f"status={w.truth}") for w in ws)
    shots = status_task.examples()
    assert [m for r, m in shots if r == "assistant"] == [f"Status: {lab}" for lab in status_task.SHOT_LABELS]
    A = status_task.answer_tokens(TOK)
    assert A[ord("u")] == "up" and A[ord("d")] == "down" and ord(" ") not in A
    with pytest.raises(ValueError):
        status_task.batch_text(np.random.default_rng(0), "sideways")


def test_collect_pairs_and_held_out_calibration_match_the_engine():
    eng = StatusEngine()
    calib = status_task.collect_pairs(eng, TOK, status_task.make_windows(30, seed=1))
    held = status_task.collect_pairs(eng, TOK, status_task.make_windows(30, seed=2))
    for p in calib + held:
        assert p.token == p.full_token == ord("u") and p.label == "up"  # the full path agrees (exact match)
        assert p.gap == pytest.approx(3.0 if p.truth == "up" else 0.5)
        assert p.header_gap == pytest.approx(1.0)
    res = calibrate_held_out([p.exact_pair() for p in calib], [p.exact_pair() for p in held], r_max=0.0)
    assert 0.5 <= res.auto_tau < 3.0  # separates the right (γ = 3) from the wrong (γ = 0.5) answers
    assert res.held_out_at_calibrated.wrong == 0
    assert res.held_out_at_calibrated.accepted == sum(p.truth == "up" for p in held)


def test_status_trace_serves_unforced_and_reports_against_the_closed_form():
    gate = GateConfig(threshold=2.0, fast_answer_set=frozenset(status_task.answer_tokens(TOK)))
    res = run_status_trace(StatusEngine(), TOK, 4.0, 12, 0.003, gate, np.random.default_rng(0),
                           delay_s=0.001, gate_coverage=0.5)
    assert res["queries"] == sum(res["paths"].values()) > 0
    assert res["h_fast"]["k"] <= round(res["measured_h"] * res["resolved_prepositions"])
    assert res["closed_form_h_fast"] == pytest.approx(0.5 * res["closed_form_h_delayed"])
    assert res["fast_accuracy"]["k"] == res["fast_accuracy"]["n"]  # γ = 3 only on "up": every fast serve right
    assert res["counters"]["served_fast_relaxed"] == 0  # the trace pre-positions the standing query only


def test_agentic_trace_serves_predicted_results():
    res = run_agentic_trace(StatusEngineForTools(), TOK, 10, GateConfig(threshold=0.0), np.random.default_rng(1))
    assert res["turns"] == 10 and res["predicted"]["k"] > 0
    assert res["fast_share"]["k"] == res["gate_fired_when_predicted"]["k"]  # only a pre-positioned result is fast
    assert res["by_tool"].get("weather", {}).get("predicted", 0) == 0  # a result never seen is never predicted


def test_agentic_trace_stays_inside_a_small_context_window():
    from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
    from forerun.runtime_ext.engine.models import build_tiny_model

    with EmbeddedEngine(build_tiny_model(max_context=640), EngineConfig(batch_window_ms=0.0)) as eng:
        res = run_agentic_trace(eng, eng.tokenizer, 12, GateConfig(threshold=0.0), np.random.default_rng(2),
                                answer_tokens_n=2)
    assert res["turns"] == 12


class StatusEngineForTools(StatusEngine):
    def generate(self, input_ids, params, *, rid=None, priority=0):
        z = np.zeros(258)
        z[(sum(input_ids) % 200) + 1] = 2.0
        lp = z - np.logaddexp.reduce(z)
        top = np.argsort(-lp, kind="stable")[:2]
        meta = {"output_top_logprobs": [[[float(lp[i]), int(i), None] for i in top]], "cached_tokens": 0}
        out = tuple([int(top[0])] * params.max_new_tokens)
        return GenerateOutput(tuple(input_ids), out, TOK.decode(list(out)), meta)


def test_bench_status_gate_held_out_disjoint(monkeypatch):
    """bench preposition's held-out status windows are disjoint from its calibration windows (seed 5: the
    two seeds' draws share one window)."""
    import contextlib

    from forerun.eval.preposition import bench, status_task
    from forerun.eval.preposition.config import BenchConfig
    from forerun.runtime_ext.standin.server import byte_tokenizer

    seen = []

    def pairs(engine, tok, windows, *, progress=None):
        seen.append(list(windows))
        return [status_task.StatusPair(w.truth, 3.0, 0, 3.0, 0, 0, w.truth, None) for w in windows]

    monkeypatch.setattr(status_task, "collect_pairs", pairs)
    bar = lambda name, total: contextlib.nullcontext(lambda: None)  # noqa: E731
    bench._status_gate(None, byte_tokenizer(), BenchConfig(status_windows=64, seed=5), bar)
    calib, held = seen
    assert len(calib) == len(held) == 64 and not set(calib) & set(held)


def test_make_windows_exclude():
    from forerun.eval.preposition.status_task import make_windows

    calib = make_windows(64, seed=0)
    plain, held = make_windows(64, seed=1), make_windows(64, seed=1, exclude=calib)
    assert set(plain) & set(calib) and not set(held) & set(calib)
    assert [w for w in plain if w not in set(calib)] == held[: len(plain) - len(set(plain) & set(calib))]


def test_bench_status_gate_gap_quantiles_with_an_infinite_gap(monkeypatch):
    """bench preposition's held-out γ quantiles stay numbers when a gap is +inf (numpy's were NaN)."""
    import contextlib

    from forerun.eval.preposition import bench, status_task
    from forerun.eval.preposition.config import BenchConfig
    from forerun.runtime_ext.standin.server import byte_tokenizer

    def pairs(engine, tok, windows, *, progress=None):
        gaps = [1.0 + i for i in range(len(windows) - 1)] + [float("inf")]
        return [status_task.StatusPair(w.truth, g, 0, 3.0, 0, 0, w.truth, None) for w, g in zip(windows, gaps)]

    monkeypatch.setattr(status_task, "collect_pairs", pairs)
    bar = lambda name, total: contextlib.nullcontext(lambda: None)  # noqa: E731
    out = bench._status_gate(None, byte_tokenizer(), BenchConfig(status_windows=3), bar)
    assert out["report"]["held_out_gap_quantiles_exact"] == pytest.approx([1.2, 2.0, float("inf")])
