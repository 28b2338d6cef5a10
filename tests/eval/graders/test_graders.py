"""Graders: every gold answer of the offline copies passes, perturbed answers fail (math and multiple choice,
on every row: they are fast).  Realistic model outputs: test_choice.py, test_math_answers.py; code and its
reference solutions: test_code.py.  GPQA rows are read from the data directory, never copied here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from forerun.eval.datasets.loading import load_prompts
from forerun.eval.graders import grade
from forerun.eval.graders.choice import extract_choice
from forerun.eval.graders.math_answers import equivalent, extract_final_answer, grade_math, normalize

DATA = Path(os.environ.get("FORERUN_DATA_DIR") or Path(__file__).resolve().parents[4] / "shared" / "datasets")
needs_data = pytest.mark.skipif(not (DATA / "math500.jsonl").is_file(), reason="offline datasets not found")


def _load(name):
    return load_prompts(name, data_dir=DATA)


@needs_data
def test_every_math_gold_answer_passes_and_other_answers_fail():
    prompts = _load("math500") + _load("aime")
    for p in prompts:
        assert grade(p, f"Reasoning...\nThus the final answer is \\boxed{{{p.answer}}}.").correct, p.id
        # the math-verify path itself, without the same-text shortcut
        assert equivalent(p.answer, p.answer + " ") and grade_math(f"\\boxed{{{p.answer}}}", p.answer)[0]
    false_pass = []
    for i, p in enumerate(prompts):
        other = prompts[(i + 7) % len(prompts)].answer
        if normalize(other) != normalize(p.answer) and grade(p, f"\\boxed{{{other}}}").correct:
            false_pass.append((p.id, p.answer, other))
    assert not false_pass


@needs_data
def test_math_gold_answers_pass_the_math_verify_comparison_alone():
    from math_verify import parse, verify

    for p in _load("math500") + _load("aime"):
        g = parse(f"${p.answer}$")
        assert g and verify(g, parse(f"${p.answer}$")), p.id


def test_math_final_answer_forms():
    assert extract_final_answer(r"so \boxed{\frac{a}{b}} and later \boxed{42}") == "42"
    assert extract_final_answer(r"\boxed{\left(3, \frac{\pi}{2}\right)}") == r"\left(3, \frac{\pi}{2}\right)"
    assert extract_final_answer("The final answer is $17$.") == "17"
    assert extract_final_answer("Answer: 12\n") == "12"
    assert extract_final_answer("#### 1,000") == "1,000"
    assert extract_final_answer("no answer here") is None
    assert grade_math(r"\boxed{0.5}", r"\frac{1}{2}")[0]
    assert grade_math(r"\boxed{\dfrac{1}{2}}", r"\frac12")[0]
    assert not grade_math(r"\boxed{0.51}", r"\frac{1}{2}")[0]
    assert grade_math(r"\boxed{336}", r"336^\circ", integer=True)[0]
    assert grade_math(r"\boxed{033}", "33", integer=True)[0]
    assert not grade_math(r"\boxed{34}", "33", integer=True)[0]
    assert not grade_math("I do not know", "33", integer=True)[0]


@needs_data
def test_every_multiple_choice_gold_letter_passes_and_the_others_fail():
    for name in ("gpqa", "mmlu"):
        for p in _load(name):
            for letter in "ABCD":
                for form in (f"Thinking... \\boxed{{{letter}}}", f"So the answer is ({letter}).",
                             f"**Answer:** {letter}", f"Reasoning.\n{letter}"):
                    g = grade(p, form)
                    assert g.correct == (letter == p.answer) and g.tests is None, (p.id, form)


def test_letter_extraction_is_robust():
    assert extract_choice(r"A) is wrong, B) too. \boxed{\text{C}}") == "C"
    assert extract_choice("The correct option is D, not A") == "D"
    assert extract_choice("the answer is a number, so (B)") == "B"
    assert extract_choice("Answer: E", num_choices=4) is None
    assert extract_choice("I cannot tell") is None


@needs_data
def test_a_reasoning_models_answer_is_read_past_its_thinking():
    """A tentative answer inside <think>...</think> is not the answer the response gives (lighteval and
    lm-eval-harness strip the reasoning); it was read first: the thinking's box over the final phrase, its explicit
    'the answer is A?' over the final mention."""
    m = next(p for p in _load("math500") if p.answer == "10")
    wrong = "9" if m.answer != "9" else "8"
    assert grade(m, f"<think>Maybe \\boxed{{{wrong}}}? Let me recount.</think>\n\nThe final answer is 10.").correct
    assert not grade(m, "<think>So \\boxed{10}, I think.</think>\n\nThe final answer is 11.").correct
    q = _load("mmlu")[0]
    other = "A" if q.answer != "A" else "B"
    assert grade(q, f"<think>So the answer is {other}? Hmm.</think>\n\nI would say ({q.answer}) fits best.").correct
    assert not grade(q, f"<think>So the answer is {q.answer}.</think>\n\nI would say ({other}) fits best.").correct
    # no closing tag (no reasoning, or cut inside it): the whole response, as before
    assert grade(m, f"<think>Counting again, \\boxed{{10}}").correct
