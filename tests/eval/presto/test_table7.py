"""The one Table 7: hand-computed columns, NaN (never an exception) for undefined ratios, and identical chains
meaning the same ids AND the same accept/reject history - from both the benchmark and the eval report."""

from __future__ import annotations

import math

from forerun.eval.harness.report import Cell, table7_row
from forerun.eval.presto.table7 import ChainTiming, table7_columns


def timing(call_time, calls, transitions, ids=(1, 2), history=(True, False)):
    return ChainTiming(call_time, call_time / calls if calls else math.nan,
                       transitions / calls if calls else math.nan, calls, tuple(ids), tuple(history))


def test_columns_match_a_hand_computation():
    pairs = [(timing(10.0, 10, 10), timing(4.0, 2, 10)), (timing(6.0, 6, 6), timing(3.0, 3, 6))]
    cols = table7_columns(pairs)
    assert cols["total_time_s"] == [8.0, 3.5]
    assert math.isclose(cols["speedup_eq20"], 8.0 / 3.5)
    assert cols["time_per_call_s"] == [1.0, 1.5]
    assert math.isclose(cols["increase_in_time_per_call"], 1.5)
    assert math.isclose(cols["reduction_in_calls"], 8.0 / 3.5 * 1.5)
    assert cols["transitions_per_call"] == [1.0, 3.5]
    assert cols["per_prompt_speedup"] == [2.5, 2.0] and cols["median_prompt_speedup"] == 2.25
    assert cols["identical_chains"] == 2 and cols["pairs"] == 2


def test_identical_needs_the_same_history_not_only_the_same_tokens():
    same_ids_other_history = (timing(1.0, 1, 1, history=(True,)), timing(1.0, 1, 1, history=(False,)))
    other_ids = (timing(1.0, 1, 1, ids=(1,)), timing(1.0, 1, 1, ids=(2,)))
    assert table7_columns([same_ids_other_history, other_ids])["identical_chains"] == 0


def test_undefined_ratios_are_nan():
    cols = table7_columns([(timing(0.0, 0, 0), timing(0.0, 0, 0))])
    assert math.isnan(cols["speedup_eq20"]) and math.isnan(cols["increase_in_time_per_call"])
    assert math.isnan(cols["median_prompt_speedup"])
    assert table7_columns([])["pairs"] == 0


def test_the_eval_report_uses_the_same_rule_on_run_records():
    def rec(seed, history):
        return {"prompt_id": "p", "seed": seed, "call_time_s": 2.0, "time_per_call_s": 1.0, "num_calls": 2,
                "transitions_per_call": 1.0, "response_ids": [5, 6], "extra": {"history": history}}
    seq = Cell("math500", "power-mh", (rec(1, [True]), rec(2, [True])), 0)
    pre = Cell("math500", "presto-power-mh", (rec(1, [True]), rec(2, [False])), 0)
    row = table7_row(seq, pre)
    assert row["pairs"] == 2 and row["identical_chains"] == 1 and row["speedup_eq20"] == 1.0
