"""Report statistics against independent computations: Eq. 20, the paired TOST; errors in the denominator."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from forerun.eval.harness.report import summarize, tost
from forerun.eval.harness.report_files import write_report


def _rec(ds, method, pid, correct, call_time, calls, ll, conf=-1.0, ids=(1, 2), tpc=None):
    return {"key": f"{ds}|{method}|{pid}|1", "dataset": ds, "method": method, "prompt_id": pid, "seed": 1,
            "correct": correct, "call_time_s": call_time, "num_calls": calls, "all_calls": calls + 1,
            "time_per_call_s": call_time / calls, "transitions_per_call": tpc, "wall_s": call_time + 0.1,
            "log_likelihood": ll, "confidence": conf, "response_ids": list(ids), "settings": {}, "model": "m"}


def test_tost_against_two_one_sided_t_tests():
    rng = np.random.default_rng(0)
    seq = rng.normal(0, 1, 40)
    pre = seq + rng.normal(0.01, 0.05, 40)
    res = tost(seq, pre)
    d = pre - seq
    delta = 0.2 * np.std(seq, ddof=1)
    se = np.std(d, ddof=1) / math.sqrt(len(d))
    p_lower = stats.t.sf((d.mean() + delta) / se, len(d) - 1)
    p_upper = stats.t.cdf((d.mean() - delta) / se, len(d) - 1)
    assert res["delta"] == pytest.approx(delta)
    assert res["p_eq"] == pytest.approx(max(p_lower, p_upper))
    assert res["equivalent"]
    far = tost(seq, seq + 0.5 + rng.normal(0, 0.05, 40))
    assert not far["equivalent"]
    assert tost([1.0, 1.0], [1.0, 0.0])["equivalent"] is None  # no spread: δ = 0
    assert tost(seq, seq)["equivalent"] is True


def test_summary_table7_and_accuracy(tmp_path):
    recs = []
    for i in range(4):
        recs.append(_rec("math500", "power-mh", f"p{i}", i % 2 == 0, 10.0 + i, 10, -1.0 - 0.1 * i, tpc=1.0))
        recs.append(_rec("math500", "presto-power-mh", f"p{i}", i % 2 == 0, 5.0 + i, 3, -1.0 - 0.1 * i, tpc=3.3))
        recs.append(_rec("math500", "greedy", f"p{i}", True, 1.0, 1, -0.5))
    recs.append(dict(_rec("math500", "greedy", "p9", False, 1.0, 1, -0.5), error="boom"))
    s = summarize(recs)
    (row,) = s["table7"]
    assert row["speedup_eq20"] == pytest.approx(np.mean([10, 11, 12, 13]) / np.mean([5, 6, 7, 8]))
    tpc_seq, tpc_pre = np.mean([(10 + i) / 10 for i in range(4)]), np.mean([(5 + i) / 3 for i in range(4)])
    assert row["increase_in_time_per_call"] == pytest.approx(tpc_pre / tpc_seq)
    assert row["reduction_in_calls"] == pytest.approx(row["speedup_eq20"] * row["increase_in_time_per_call"])
    assert row["identical_chains"] == 4
    greedy = next(c for c in s["cells"] if c["method"] == "greedy")
    assert (greedy["n"], greedy["correct"], greedy["errors"]) == (5, 4, 1)  # an error is a wrong answer
    assert greedy["accuracy"] == pytest.approx(0.8) and greedy["pass_at_k"] == {"1": pytest.approx(0.8)}
    assert row["speedup_ci95"][0] <= row["speedup_eq20"] <= row["speedup_ci95"][1]
    comp = {(c["method"], c["baseline"]) for c in s["comparisons"]}
    assert comp == {("power-mh", "greedy"), ("presto-power-mh", "power-mh")}
    assert s["errors"] == [{"key": "math500|greedy|p9|1", "error": "boom"}]
    ll = next(r for r in s["tost"] if r["statistic"] == "log_likelihood")
    assert ll["equivalent"] is True
    _, files = write_report(recs, tmp_path / "rep", run_path="run.jsonl", command="forerun eval report run.jsonl")
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "pass@1" in text and "McNemar" in text and "Eq. 20" in text and "TOST" in text and "boom" in text
    assert all(f.exists() and f.stat().st_size > 0 for f in files)
