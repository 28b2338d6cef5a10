"""The streaming trend task: windows, answer set, pair collection through real sessions on a fake engine."""

from __future__ import annotations

import re

import numpy as np
import pytest

from forerun.eval.preposition.trend_task import QUESTION, TrendPair, answer_tokens, collect_pairs, make_windows, report
from forerun.runtime_ext.protocol import GenerateOutput
from forerun.runtime_ext.standin.server import byte_tokenizer

TOK = byte_tokenizer()


def test_windows_have_unambiguous_direction():
    ws = make_windows(200, 10, seed=3)
    assert len(ws) == 200 and {w.direction for w in ws} == {"up", "down"}
    for w in ws:
        slope = np.polyfit(np.arange(10), w.prices, 1)[0]
        assert (slope > 0) == (w.direction == "up")
    assert make_windows(5, seed=1) == make_windows(5, seed=1)
    with pytest.raises(ValueError, match="length"):
        make_windows(3, 1)


def test_answer_tokens_drop_ambiguous_first_tokens():
    A = answer_tokens(TOK)
    assert A[ord("u")] == "up" and A[ord("d")] == "down" and A[ord("D")] == "down"
    assert ord(" ") not in A  # " up" and " down" share their first byte


class TrendEngine:
    """Reads the last window from the ids; the header token says its direction with a gap that grows with
    the window's spread.  With the question in context it answers the opposite when the window starts
    above 100 (a question-dependent divergence the gate should count as a false accept)."""

    tokenizer = TOK

    def generate(self, input_ids, params, *, rid=None, priority=0):
        text = TOK.decode(input_ids)
        prices = [float(x) for x in re.findall(r"-?\d+\.\d+", text.rsplit("New data:", 1)[1])]
        up = prices[-1] > prices[0]
        if QUESTION in text and prices[0] > 100:
            up = not up
        logits = np.zeros(258)
        logits[ord("u" if up else "d")] = abs(prices[-1] - prices[0]) / 4
        lp = logits - np.logaddexp.reduce(logits)
        top = np.argsort(-lp, kind="stable")[:2]
        meta = {"output_top_logprobs": [[[float(lp[i]), int(i), None] for i in top]], "cached_tokens": 0}
        return GenerateOutput(tuple(input_ids), (int(top[0]),), chr(int(top[0])), meta)


def test_collect_and_report_match_brute_force():
    ws = make_windows(40, 8, seed=0)
    ticks = []
    pairs = collect_pairs(TrendEngine(), TOK, ws, progress=lambda: ticks.append(1))
    assert len(pairs) == len(ticks) == 40
    for w, p in zip(ws, pairs):
        assert p.truth == w.direction and p.fast_label == w.direction and p.in_answer_set
        shown = [float(x) for x in w.text().split(", ")]
        assert p.logit_gap == pytest.approx(abs(shown[-1] - shown[0]) / 4)
        assert (p.fast_token == p.full_token) == (w.prices[0] <= 100)
    rep, points = report(pairs, tau=2.0, r_max=0.2, answer_set_size=len(answer_tokens(TOK)))
    acc = [p for p in pairs if p.logit_gap > 2.0]
    assert rep.at_tau.accepted == len(acc)
    assert rep.at_tau.false_accept == pytest.approx(np.mean([p.fast_token != p.full_token for p in acc]))
    assert rep.fast_accuracy == 1.0
    assert rep.agreement == pytest.approx(np.mean([w.prices[0] <= 100 for w in ws]))
    assert rep.n == 40 and points


def test_answer_lead_moves_the_decision_point():
    seen = []

    class Spy(TrendEngine):
        def generate(self, input_ids, params, *, rid=None, priority=0):
            seen.append(TOK.decode(input_ids))
            return super().generate(input_ids, params, rid=rid, priority=priority)

    collect_pairs(Spy(), TOK, make_windows(2, 8, seed=0), answer_lead="The trend is")
    assert seen and all(t.endswith("<|im_start|>assistant\nThe trend is") for t in seen)


def _oracle_pick(pairs, r_max):
    """Brute force over the accepted sets the gate can realise: for each k, the admissible pairs with the k
    largest gaps (a set only if the k-th gap is strictly above the next); the largest such set with
    wrong/accepted <= r_max.  Returns that set's smallest gap (the picked τ lies just below it), or None."""
    adm = sorted((p for p in pairs if p.in_answer_set and p.logit_gap > 0), key=lambda p: -p.logit_gap)
    best = None
    for k in range(1, len(adm) + 1):
        if k < len(adm) and adm[k].logit_gap == adm[k - 1].logit_gap:
            continue  # a tie: no τ accepts exactly these k
        wrong = sum(p.fast_token != p.full_token for p in adm[:k])
        if wrong <= r_max * k:
            best = adm[k - 1].logit_gap
    return best


def _pair(gap, right):
    return TrendPair(logit_gap=gap, fast_token=1, in_answer_set=True, full_token=1 if right else 2, truth="up",
                     fast_label="up", full_label="up")


@pytest.mark.parametrize("r_max", [0.0, 0.1, 0.3])
def test_report_picks_tau_on_even_windows_and_judges_it_on_odd_ones(r_max):
    """τ for r ≤ r_max is picked on positions 0, 2, ... only (brute-force oracle), and its coverage / false
    accept are counted by hand on positions 1, 3, ... (the windows it was not picked on)."""
    rng = np.random.default_rng(4)
    gaps = np.round(rng.uniform(0, 5, 60), 1)  # rounded: ties between gaps
    pairs = [_pair(float(g), right=bool(rng.random() < (0.97 if g > 2.5 else 0.5))) for g in gaps]
    pairs[7] = TrendPair(4.9, 3, False, 3, "up", None, None)  # outside A: never accepted
    rep, _ = report(pairs, tau=2.0, r_max=r_max)
    calib, held = pairs[0::2], pairs[1::2]
    assert (rep.calibration_windows, rep.held_out_windows) == (30, 30) and "positions 0, 2" in rep.split
    assert rep.at_tau.n == 60  # the reference τ, fixed in advance, on every window
    smallest_accepted_gap = _oracle_pick(calib, r_max)
    if smallest_accepted_gap is None:
        assert rep.calibration.calibrated is None and rep.calibration.held_out_at_calibrated is None
        return
    tau = rep.calibration.calibrated.threshold
    assert tau < smallest_accepted_gap and not any(tau < p.logit_gap < smallest_accepted_gap for p in calib)
    out = rep.calibration.held_out_at_calibrated
    accepted = [p for p in held if p.in_answer_set and p.logit_gap > tau]
    assert (out.n, out.accepted) == (30, len(accepted)) and 0 < len(accepted) < 30
    assert out.wrong == sum(p.fast_token != p.full_token for p in accepted)
    assert out.false_accept_ci[0] <= out.false_accept <= out.false_accept_ci[1]  # Wilson, on held-out counts


def test_report_does_not_judge_the_picked_tau_on_the_windows_it_was_picked_on():
    """Every calibration window right, every held-out window wrong: an in-sample report reads false accept 0
    at the picked τ; the held-out figure reads 1."""
    pairs = [_pair(1.0 + i, right=i % 2 == 0) for i in range(10)]
    rep, _ = report(pairs, tau=2.0, r_max=0.05)
    assert rep.calibration.calibrated.false_accept == 0.0 and rep.calibration.calibrated.n == 5
    held = rep.calibration.held_out_at_calibrated
    assert held.n == 5 and held.accepted == 5 and held.false_accept == 1.0
    assert held.false_accept_ci[0] > 0.5
    d = rep.as_dict()
    assert d["calibration"]["held_out_at_calibrated"]["false_accept"] == 1.0 and "auto_tau" in d["calibration"]
    assert "calibrated" not in d  # no in-sample figure left at the top level


def test_split_needs_two_windows():
    from forerun.eval.preposition.trend_task import split_windows

    assert split_windows([1, 2, 3]) == ([1, 3], [2])
    with pytest.raises(ValueError, match="at least 2"):
        report([_pair(1.0, True)])
