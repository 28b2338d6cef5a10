"""The eval statistics against independent computations: pass@k by enumerating k-subsets, maj@k by hand, the
exact McNemar test as a binomial test on the discordant pairs, bootstrap intervals resampling prompts (never
seeds) with scipy directly, Wilson intervals by statsmodels."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from forerun.eval.harness.statistics import (compare, majority_correct, pass_at_k, percentile_ci,
                                             sample_statistics, speedup_ci)


def _rec(pid, seed, correct, answer=None, grader="math"):
    return {"prompt_id": pid, "seed": seed, "correct": correct,
            "grade": {"grader": grader, "extracted": answer, "correct": correct}}


@pytest.mark.parametrize("n,c", [(1, 0), (1, 1), (4, 1), (5, 2), (6, 6), (7, 3)])
def test_pass_at_k_is_the_chance_a_random_k_subset_holds_a_correct_sample(n, c):
    samples = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(samples, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_majority_vote_ties_go_to_the_earliest_answer_and_no_answer_does_not_vote():
    assert majority_correct([("2", False), ("3", True), ("3", True)]) is True
    assert majority_correct([("2", False), ("3", True)]) is False  # tie: the earliest, "2"
    assert majority_correct([(None, True), ("5", False)]) is False
    assert majority_correct([(None, True)]) is False


def test_majority_vote_counts_equal_answers_written_differently_as_one():
    """Votes were grouped by raw text: "\\frac12" and "1/2" (both the gold 1/2) split their two votes and lost
    the tie to "3"; two ways of writing the wrong 2/3 likewise lost to one correct answer."""
    got = [(r"\boxed{3}", False), (r"\boxed{\frac12}", True), (r"\boxed{1/2}", True)]
    recs = [_rec("p", s, ok, answer=text[len(r"\boxed{"):-1]) for s, (text, ok) in enumerate(got)]
    assert sample_statistics(recs)["maj_at_k"] == {"3": 1.0}  # 2 of 3 samples answer the gold
    assert majority_correct([(r"\frac12", True), (r"\dfrac{2}{3}", False), (r"\frac{2}{3}", False)]) is False
    # one wrong integer written two ways (AIME's "042" and "42") is one answer with two votes: it ties the correct
    # answer's two and, earlier, wins; split, it lost and maj@k read the prompt as solved
    assert majority_correct([("042", False), ("7", True), ("42", False), ("7", True)]) is False
    assert majority_correct([("42", False), ("7", True), (r"\text{7}", True), ("43", False)]) is True
    # a wrong number written with units or as text is the same wrong vote as the number (graded by it)
    assert majority_correct([("7", True), ("5", False), (r"\text{5 inches}", False)]) is False
    assert majority_correct([("7", True), ("12", False), ("12 cm^2", False)]) is False
    assert majority_correct([("7", True), ("12", False), ("12 \\pi", False)]) is True  # pi is not a unit


def test_sample_statistics_reduce_each_prompt_first_then_resample_prompts():
    recs = [_rec("a", 1, True, "4"), _rec("a", 2, False, "5"), _rec("a", 3, True, "4"),
            _rec("b", 1, False, "1"), _rec("b", 2, False, "2"), _rec("b", 3, True, "3"),
            _rec("c", 1, True, "7"), _rec("c", 2, True, "7"), _rec("c", 3, True, "7")]
    s = sample_statistics(recs)
    assert s["prompts"] == 3 and s["samples"] == 3
    assert s["pass_at_k"]["1"] == pytest.approx(np.mean([2 / 3, 1 / 3, 1.0]))
    assert s["pass_at_k"]["2"] == pytest.approx(np.mean([1.0, 1 - 1 / 3, 1.0]))
    assert s["maj_at_k"] == {"3": pytest.approx(2 / 3)}  # a: "4" wins (right); b: tie -> "1" (wrong); c: right
    per_prompt = np.array([2 / 3, 1 / 3, 1.0])
    want = stats.bootstrap((per_prompt,), np.mean, n_resamples=2000, method="percentile", random_state=0)
    assert s["ci95"] == pytest.approx([want.confidence_interval.low, want.confidence_interval.high])
    code = sample_statistics([_rec("a", 1, True, None, "code")])
    assert code["maj_at_k"] == {} and code["ci95"] == pytest.approx(proportion_confint(1, 1, method="wilson"))


def test_an_accuracy_of_none_right_is_not_reported_as_certain():
    """One seed, 0 of 21 prompts right: the report printed "0 [0, 0]".  Oracle: statsmodels' Wilson interval."""
    s = sample_statistics([_rec(f"p{i}", 10086, False, "1") for i in range(21)])
    assert s["pass_at_k"]["1"] == 0.0
    assert s["ci95"] == pytest.approx(proportion_confint(0, 21, method="wilson"))
    assert s["ci95"][1] > 0.15
    # several seeds that agree on every prompt: k of P prompts, not of P x seeds samples
    agree = sample_statistics([_rec(f"p{i}", s, i < 2, "1") for i in range(6) for s in range(4)])
    assert agree["ci95"] == pytest.approx(proportion_confint(2, 6, method="wilson"))
    both_wrong = compare([_rec(f"p{i}", 1, False) for i in range(3)], [_rec(f"p{i}", 1, False) for i in range(3)])
    assert both_wrong["diff"] == 0.0 and all(math.isnan(v) for v in both_wrong["diff_ci95"])


def test_mcnemar_is_an_exact_binomial_test_on_the_discordant_pairs():
    base = [_rec(f"p{i}", 1, i < 10) for i in range(30)]
    method = [_rec(f"p{i}", 1, i < 3 or 10 <= i < 20) for i in range(30)]  # 7 lost, 10 gained
    out = compare(method, base)
    assert out["mcnemar_table"] == [[3, 7], [10, 10]]
    assert out["mcnemar_p"] == pytest.approx(stats.binomtest(7, 17, 0.5).pvalue)
    assert out["diff"] == pytest.approx((13 - 10) / 30)
    lo, hi = out["diff_ci95"]
    assert lo < out["diff"] < hi


def test_several_seeds_per_prompt_are_tested_over_prompts_not_as_independent_pairs():
    """--samples 8, greedy (the same answer every seed) against a method that wins 4 prompts, loses 1, ties 1.
    The 'exact McNemar' p counted 48 (prompt, seed) pairs as independent: 1.8e-4; the evidence is 4 prompts to 1."""
    outcome = {"p0": (0, 1), "p1": (0, 1), "p2": (0, 1), "p3": (0, 1), "p4": (1, 0), "p5": (1, 1)}
    base = [_rec(p, s, bool(b)) for p, (b, _) in outcome.items() for s in range(8)]
    method = [_rec(p, s, bool(m)) for p, (_, m) in outcome.items() for s in range(8)]
    out = compare(method, base)
    assert out["test"] == "sign test over prompts" and out["mcnemar_p"] is None
    assert out["p_value"] == pytest.approx(stats.binomtest(4, 5, 0.5).pvalue)  # 0.375
    # seeds that disagree within a prompt: the signs of the per-prompt accuracy differences
    rng = np.random.default_rng(3)
    base = [_rec(f"p{i}", s, bool(rng.random() < 0.4)) for i in range(9) for s in range(3)]
    method = [_rec(f"p{i}", s, bool(rng.random() < 0.7)) for i in range(9) for s in range(3)]
    d = np.array([np.mean([float(m["correct"]) - float(b["correct"]) for m, b in zip(method, base)
                           if m["prompt_id"] == f"p{i}"]) for i in range(9)])
    wins, losses = int(np.sum(d > 0)), int(np.sum(d < 0))  # prompts the method is better / worse on
    assert compare(method, base)["p_value"] == pytest.approx(stats.binomtest(wins, wins + losses, 0.5).pvalue)
    one = compare([_rec(f"p{i}", 1, i < 3 or 10 <= i < 20) for i in range(30)],
                  [_rec(f"p{i}", 1, i < 10) for i in range(30)])
    assert one["test"] == "exact McNemar" and one["p_value"] == pytest.approx(stats.binomtest(7, 17, 0.5).pvalue)


def test_speedup_interval_holds_eq20_and_survives_nan():
    seq, pre = [10.0, 12.0, 11.0, 9.0], [5.0, 5.5, 6.0, 4.0]
    lo, hi = speedup_ci(seq, pre)
    assert lo <= np.mean(seq) / np.mean(pre) <= hi
    assert all(math.isnan(x) for x in speedup_ci([1.0], [math.nan]))
