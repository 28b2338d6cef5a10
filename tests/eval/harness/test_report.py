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


def _front_by_sweep(points):
    """Independent oracle of the Pareto frontier: sweep times in increasing order; a point is on it when it is
    the most accurate at its time and more accurate than everything strictly faster."""
    out = [None] * len(points)
    best_before = -math.inf
    for t in sorted({t for _, t in points}):
        group = [i for i, (_, u) in enumerate(points) if u == t]
        top = max(points[i][0] for i in group)
        for i in group:
            out[i] = points[i][0] == top and points[i][0] > best_before
        best_before = max(best_before, top)
    return out


def test_pareto_front_against_a_sweep():
    from forerun.eval.harness.frontier import pareto_front

    assert pareto_front([(0.5, 1.0), (0.5, 2.0), (0.7, 2.0), (0.7, 2.0), (0.2, 0.5)]) == [True, False, True, True,
                                                                                          True]
    assert pareto_front([(0.5, math.nan), (0.1, 3.0)]) == [None, True]  # NaN: not compared, dominates nothing
    rng = np.random.default_rng(1)
    for _ in range(200):  # small integer grids: many ties in accuracy and in time
        pts = [(float(a), float(t)) for a, t in rng.integers(0, 4, size=(int(rng.integers(1, 9)), 2))]
        assert pareto_front(pts) == _front_by_sweep(pts), pts


def test_every_sampler_table_per_dataset_and_over_shared_datasets(tmp_path):
    import json

    recs = []
    for ds in ("math500", "gpqa"):
        for i in range(4):  # greedy: fast, 2/4; power-mh: slow, 3/4 (math500) and 1/4 (gpqa); best-of-n: slow, 1/4
            recs.append(dict(_rec(ds, "greedy", f"p{i}", i < 2, 1.0, 1, -0.5), tokens_decoded=10))
            if ds == "math500" and i == 3:  # an error: counts as a wrong answer
                recs.append(dict(_rec(ds, "power-mh", f"p{i}", False, 1.0, 1, -0.5), error="boom"))
            else:
                recs.append(dict(_rec(ds, "power-mh", f"p{i}", i < (3 if ds == "math500" else 1), 9.0, 9, -0.4),
                                 tokens_decoded=100))
            recs.append(dict(_rec(ds, "best-of-n", f"p{i}", i < 1, 4.0, 1, -0.3), tokens_decoded=40 + i))
    recs.append(dict(_rec("mmlu", "greedy", "p0", True, 1.0, 1, -0.5), tokens_decoded=5))  # only greedy ran mmlu
    s = summarize(recs)
    assert s["sampler_datasets"] == ["math500", "gpqa"]
    rows = {(r["scope"], r["method"]): r for r in s["samplers"]}
    assert [r["scope"] for r in s["samplers"]][:3] == ["all"] * 3
    assert rows[("math500", "power-mh")]["answers"] == 4 and rows[("math500", "power-mh")]["errors"] == 1
    assert rows[("math500", "power-mh")]["pass_at_1"] == pytest.approx(3 / 4)
    assert rows[("math500", "power-mh")]["wall_s"] == pytest.approx(9.1)  # graded items only (the error has none)
    assert rows[("all", "power-mh")]["pass_at_1"] == pytest.approx(4 / 8)  # mmlu is not shared: left out of "all"
    assert rows[("all", "greedy")]["answers"] == 8 and rows[("mmlu", "greedy")]["answers"] == 1
    assert rows[("all", "best-of-n")]["tokens_decoded"] == pytest.approx(41.5)
    lo, hi = rows[("all", "greedy")]["ci95"]
    assert lo < 0.5 < hi
    # frontier: greedy (fastest) always; power-mh only where it is more accurate than greedy; best-of-n never
    front = {k: r["frontier"] for k, r in rows.items()}
    assert front[("math500", "greedy")] and front[("math500", "power-mh")] and not front[("math500", "best-of-n")]
    assert front[("gpqa", "greedy")] and not front[("gpqa", "power-mh")] and not front[("gpqa", "best-of-n")]
    assert front[("all", "greedy")] and not front[("all", "power-mh")]  # 4/8 = 1/2, and slower
    _, files = write_report(recs, tmp_path / "rep", run_path="run.jsonl", command="forerun eval report run.jsonl")
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "## Every sampler" in text and "| all | greedy | 8 | 50 [" in text and "Pareto frontier" in text
    assert json.loads((tmp_path / "rep" / "summary.json").read_text())["samplers"][0]["scope"] == "all"
    assert (tmp_path / "rep" / "accuracy_vs_latency.png").stat().st_size > 0


def test_every_sampler_table_of_a_cut_run_compares_the_items_every_method_has():
    """A run killed part-way: greedy finished 4 prompts, power-mh only the easy p0.  The table ("Same prompts for
    every method") showed power-mh at 1/1 against greedy's 1/4 and put it on the frontier; on the shared p0 both
    are right and greedy is faster."""
    recs = [dict(_rec("math500", "greedy", f"p{i}", i == 0, 1.0, 1, -0.5), tokens_decoded=10) for i in range(4)]
    recs.append(dict(_rec("math500", "power-mh", "p0", True, 9.0, 9, -0.4), tokens_decoded=100))
    rows = {(r["scope"], r["method"]): r for r in summarize(recs)["samplers"]}
    for scope in ("all", "math500"):
        assert rows[(scope, "greedy")]["answers"] == rows[(scope, "power-mh")]["answers"] == 1
        assert rows[(scope, "greedy")]["pass_at_1"] == rows[(scope, "power-mh")]["pass_at_1"] == 1.0
        assert rows[(scope, "greedy")]["frontier"] and not rows[(scope, "power-mh")]["frontier"]


def test_report_names_the_selection_rules_with_their_bias(tmp_path):
    from forerun.programs.selection_rules import FINAL_RULES, SELECT_RULES

    recs = [dict(_rec("mmlu", "best-of-n", "p0", True, 1.0, 1, -0.5), settings={"select": "logp0"}),
            dict(_rec("mmlu", "power-smc", "p0", True, 1.0, 1, -0.5), settings={"final": "max"}),
            _rec("mmlu", "greedy", "p0", True, 1.0, 1, -0.5)]
    s = summarize(recs)
    assert s["selection_rules"] == {"best-of-n": f"best-of-n selects by logp0: {SELECT_RULES['logp0']}",
                                    "power-smc": f"power-smc selects by max: {FINAL_RULES['max']}"}
    write_report(recs, tmp_path / "rep", run_path="run.jsonl", command="c")
    text = (tmp_path / "rep" / "report.md").read_text()
    assert FINAL_RULES["max"] in text and SELECT_RULES["logp0"] in text


def test_pooled_tost_does_not_drop_a_dataset_where_presto_differs_and_sequential_has_no_spread():
    """aime: sequential always wrong (sd 0, nothing to standardize by), PreSTO always right.  The pooled row left
    aime out silently and called the samplers equivalent on accuracy from math500 alone."""
    recs = []
    for i in range(10):  # math500: identical chains, accuracy varies
        recs += [_rec("math500", m, f"p{i}", i % 2 == 0, 1.0, 1, -0.5 - i) for m in ("power-mh", "presto-power-mh")]
    for i in range(6):
        recs += [_rec("aime", "power-mh", f"a{i}", False, 1.0, 1, -1.0 - i),
                 _rec("aime", "presto-power-mh", f"a{i}", True, 1.0, 1, -1.0 - i)]
    pooled = {r["statistic"]: r for r in summarize(recs)["tost_pooled"]}
    assert pooled["correct"]["equivalent"] is None and "aime" in pooled["correct"]["note"]
    assert pooled["log_likelihood"]["equivalent"] is True  # identical there: nothing left out


def test_speedup_interval_resamples_prompts_not_seeds():
    """--samples 8: a prompt's seeds take almost the same time, prompts differ a lot.  The interval resampled the
    32 (prompt, seed) pairs as independent, about sqrt(8) times too narrow."""
    rng = np.random.default_rng(5)
    recs, seq_by_prompt, pre_by_prompt = [], [], []
    for i, (s_t, p_t) in enumerate([(10.0, 2.0), (10.0, 9.0), (30.0, 5.0), (12.0, 11.0)]):
        seq_t, pre_t = s_t + rng.normal(0, 0.01, 8), p_t + rng.normal(0, 0.01, 8)
        seq_by_prompt.append(seq_t.mean())
        pre_by_prompt.append(pre_t.mean())
        for seed in range(8):
            for m, t in (("power-mh", seq_t[seed]), ("presto-power-mh", pre_t[seed])):
                recs.append(dict(_rec("math500", m, f"p{i}", True, float(t), 4, -1.0), seed=seed,
                                 key=f"math500|{m}|p{i}|{seed}"))
    (row,) = summarize(recs)["table7"]
    want = stats.bootstrap((np.array(seq_by_prompt), np.array(pre_by_prompt)), lambda x, y: np.mean(x) / np.mean(y),
                           paired=True, vectorized=False, n_resamples=2000, method="percentile", random_state=0)
    assert row["speedup_ci95"] == pytest.approx([want.confidence_interval.low, want.confidence_interval.high])


def test_tost_takes_prompts_as_its_units_not_seeds():
    """--samples 8: each prompt's 8 seeds give nearly the same log-likelihood.  TOST counted the 40 (prompt, seed)
    pairs as independent and its δ was an sd across items; the units are the 5 prompts (their seeds' means)."""
    rng = np.random.default_rng(7)
    recs, seq_m, pre_m = [], [], []
    for i in range(5):
        base, shift = rng.normal(-1.0, 1.0), rng.normal(0.0, 0.15)
        seq_ll, pre_ll = base + rng.normal(0, 0.01, 8), base + shift + rng.normal(0, 0.01, 8)
        seq_m.append(seq_ll.mean())
        pre_m.append(pre_ll.mean())
        for seed in range(8):
            for m, ll in (("power-mh", seq_ll[seed]), ("presto-power-mh", pre_ll[seed])):
                recs.append(dict(_rec("math500", m, f"p{i}", True, 1.0, 1, float(ll)), seed=seed,
                                 key=f"math500|{m}|p{i}|{seed}"))
    row = next(r for r in summarize(recs)["tost"] if r["statistic"] == "log_likelihood")
    d = np.array(pre_m) - np.array(seq_m)
    delta = 0.2 * np.std(seq_m, ddof=1)
    se = np.std(d, ddof=1) / math.sqrt(len(d))
    p_eq = max(stats.t.sf((d.mean() + delta) / se, len(d) - 1), stats.t.cdf((d.mean() - delta) / se, len(d) - 1))
    assert row["n"] == 5 and row["delta"] == pytest.approx(delta) and row["p_eq"] == pytest.approx(p_eq)


def test_report_numbers_do_not_depend_on_the_order_items_finished_in():
    """`forerun eval --concurrency C` writes each item when it finishes: a cell's prompts and seeds land in the file
    in completion order, not in plan order.  The report of the same results must not change with that order; the
    bootstrap intervals (fixed random_state, values taken in prompt order) did: ci95, forced_ci95, diff_ci95 and
    speedup_ci95 moved with it.  Oracle: scipy's bootstrap over the per-prompt values in prompt order, built here."""
    rng = np.random.default_rng(11)
    plan = []  # plan order: method, prompt, seed (`runs.plan_items`)
    times = {}
    for method in ("greedy", "power-mh", "presto-power-mh"):
        for i in range(7):
            for seed in (1, 2, 3):
                t = float(rng.uniform(1.0, 20.0))
                times[(method, i, seed)] = t
                rec = dict(_rec("math500", method, f"p{i}", bool(rng.random() < 0.2 + 0.1 * i), t, 4, -1.0 - i / 10),
                           seed=seed, key=f"math500|{method}|p{i}|{seed}", prompt_index=i,
                           forced_correct=bool(rng.random() < 0.5))
                plan.append(rec)
    def per_prompt(method, value):
        return np.array([np.mean([value(r) for r in plan if r["method"] == method and r["prompt_index"] == i])
                         for i in range(7)])

    def interval(*samples, **kw):
        res = stats.bootstrap(samples, kw.pop("statistic", np.mean), n_resamples=2000, method="percentile",
                              random_state=0, **kw)
        return [res.confidence_interval.low, res.confidence_interval.high]

    acc = {m: per_prompt(m, lambda r: r["correct"]) for m in ("greedy", "power-mh", "presto-power-mh")}
    forced = {m: per_prompt(m, lambda r: r["forced_correct"]) for m in acc}
    seq_t, pre_t = (per_prompt(m, lambda r: r["call_time_s"]) for m in ("power-mh", "presto-power-mh"))
    want_speedup = interval(seq_t, pre_t, paired=True, vectorized=False, statistic=lambda x, y: np.mean(x) / np.mean(y))
    want_diff = {("power-mh", "greedy"): interval(acc["greedy"], acc["power-mh"], paired=True, vectorized=False,
                                                  statistic=lambda x, y: np.mean(y) - np.mean(x)),
                 ("presto-power-mh", "power-mh"): interval(acc["power-mh"], acc["presto-power-mh"], paired=True,
                                                           vectorized=False,
                                                           statistic=lambda x, y: np.mean(y) - np.mean(x))}
    for k in range(5):  # completion orders of a --concurrency run (and the plan order itself)
        order = plan if k == 0 else [plan[j] for j in np.random.default_rng(k).permutation(len(plan))]
        got = summarize(order)
        for c in got["cells"]:
            assert c["ci95"] == pytest.approx(interval(acc[c["method"]])), (k, c["method"])
            assert c["forced_ci95"] == pytest.approx(interval(forced[c["method"]])), (k, c["method"])
        for c in got["comparisons"]:
            assert c["diff_ci95"] == pytest.approx(want_diff[(c["method"], c["baseline"])]), (k, c["method"])
        for r in got["samplers"]:
            assert r["ci95"] == pytest.approx(interval(acc[r["method"]])), (k, r["scope"], r["method"])
        assert got["table7"][0]["speedup_ci95"] == pytest.approx(want_speedup), k


def test_report_tables_list_datasets_and_methods_in_one_order_whatever_order_items_finished_in():
    """Under --concurrency the first line of a cell is the first of its items to FINISH: best-of-n's could precede
    greedy's, an mmlu item a math500 one.  The tables listed cells in that order (`forerun eval` at --concurrency 5
    on the tiny model printed best-of-n above greedy; at 4, mmlu greedy inside math500's rows).  The oracle: the
    registry's dataset order and the methods table's order (`settings.METHODS`), written out here."""
    rng = np.random.default_rng(2)
    plan = []
    for ds in ("math500", "gpqa", "mmlu"):
        for method in ("greedy", "best-of-n", "power-mh", "presto-power-mh", "power-smc"):
            for i in range(3):
                t = float(rng.uniform(1.0, 5.0))
                plan.append(dict(_rec(ds, method, f"p{i}", bool(rng.random() < 0.5), t, 3, -t), prompt_index=i,
                                 key=f"{ds}|{method}|p{i}|1"))
    want_datasets = ["math500", "gpqa", "mmlu"]
    want_methods = ["greedy", "best-of-n", "power-mh", "presto-power-mh", "power-smc"]
    reference = summarize(plan)
    assert [(c["dataset"], c["method"]) for c in reference["cells"]] == [(d, m) for d in want_datasets
                                                                         for m in want_methods]
    for k in range(1, 6):
        order = [plan[j] for j in np.random.default_rng(k).permutation(len(plan))]
        got = summarize(order)
        assert [(c["dataset"], c["method"]) for c in got["cells"]] == [(d, m) for d in want_datasets
                                                                       for m in want_methods], k
        assert [(r["scope"], r["method"]) for r in got["samplers"]] == [
            (s, m) for s in ["all", *want_datasets] for m in want_methods], k
        assert got == reference, k  # every table, row for row (NaN-free records: == compares every number)
