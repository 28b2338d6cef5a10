"""The streaming trend task: windows, answer set, pair collection through real sessions on a fake engine."""

from __future__ import annotations

import re

import numpy as np
import pytest

from forerun.eval.preposition.trend_task import QUESTION, answer_tokens, collect_pairs, make_windows, report
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
