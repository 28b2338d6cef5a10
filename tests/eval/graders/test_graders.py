"""Graders: every gold answer / reference solution of the offline copies passes, perturbed answers fail.

Math and multiple choice run on every row (they are fast); the code references run in the sandbox, so the
default suite runs a prefix of HumanEval and MBPP and `-m slow` runs all of them.  LiveCodeBench's offline
copy has no reference solution: hand-written solutions of one stdin and one functional problem stand in.
GPQA rows are read from the data directory, never copied here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from forerun.eval.datasets.loading import load_prompts
from forerun.eval.graders import grade
from forerun.eval.graders.choice import extract_choice
from forerun.eval.graders.code import extract_code, grade_code, stdout_matches
from forerun.eval.graders.math_answers import equivalent, extract_final_answer, grade_math, normalize

DATA = Path(os.environ.get("FORERUN_DATA_DIR") or Path(__file__).resolve().parents[4] / "shared" / "datasets")
needs_data = pytest.mark.skipif(not (DATA / "math500.jsonl").is_file(), reason="offline datasets not found")
CODE_PREFIX = 25


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
                    assert grade(p, form).correct == (letter == p.answer), (p.id, form)


def test_letter_extraction_is_robust():
    assert extract_choice(r"A) is wrong, B) too. \boxed{\text{C}}") == "C"
    assert extract_choice("The correct option is D, not A") == "D"
    assert extract_choice("the answer is a number, so (B)") == "B"
    assert extract_choice("Answer: E", num_choices=4) is None
    assert extract_choice("I cannot tell") is None


@needs_data
def test_humaneval_canonical_solutions_pass_and_broken_ones_fail():
    for p in _load("humaneval")[:CODE_PREFIX]:
        assert grade_code(p.extra["prompt"] + p.answer, "humaneval", p.extra, extracted=True)[0], p.id
        assert not grade_code(p.extra["prompt"] + "    return None\n", "humaneval", p.extra, extracted=True)[0]


@needs_data
def test_mbpp_reference_code_passes_and_another_tasks_code_fails():
    prompts = _load("mbpp")[:CODE_PREFIX]
    for i, p in enumerate(prompts):
        assert grade_code(p.answer, "mbpp", p.extra, extracted=True)[0], p.id
        assert not grade_code(prompts[(i + 1) % len(prompts)].answer, "mbpp", p.extra, extracted=True)[0]


@pytest.mark.slow
@needs_data
@pytest.mark.parametrize("name", ["humaneval", "mbpp"])
def test_every_code_reference_passes(name):
    for p in _load(name):
        code = p.extra["prompt"] + p.answer if name == "humaneval" else p.answer
        assert grade_code(code, name, p.extra, extracted=True)[0], p.id


SECOND_LARGEST = """
n = int(input())
a = list(map(int, input().split()))
print(sorted(range(n), key=lambda i: a[i])[-2] + 1)
"""
SHORTEST_PATHS = """
from collections import deque
class Solution:
    def shortestDistanceAfterQueries(self, n, queries):
        adj = [[i + 1] if i + 1 < n else [] for i in range(n)]
        out = []
        for u, v in queries:
            adj[u].append(v)
            dist = [-1] * n
            dist[0] = 0
            q = deque([0])
            while q:
                x = q.popleft()
                for y in adj[x]:
                    if dist[y] < 0:
                        dist[y] = dist[x] + 1
                        q.append(y)
            out.append(dist[n - 1])
        return out
"""


@needs_data
def test_livecodebench_stdin_and_functional_tests_run():
    prompts = _load("lcb-v5")
    stdin_p = prompts[0]
    func_p = next(p for p in prompts if p.extra["func_name"] == "shortestDistanceAfterQueries")
    assert grade(stdin_p, f"```python\n{SECOND_LARGEST}```").correct
    assert not grade(stdin_p, f"```python\n{SECOND_LARGEST.replace('[-2]', '[-1]')}```").correct
    assert grade(func_p, f"```python\n{SHORTEST_PATHS}```").correct
    assert not grade(func_p, f"```python\n{SHORTEST_PATHS.replace('dist[n - 1]', 'dist[n - 2]')}```").correct
    assert all(p.extra["tests"] for p in prompts)


def test_code_extraction_and_output_comparison():
    assert extract_code("text\n```python\nx = 1\n```\nmore\n```python\ny = 2\n```") == "y = 2\n"
    assert extract_code("```python\ndef f():\n    return 1") == "def f():\n    return 1"  # cut at n tokens
    assert extract_code("print(1)") == "print(1)"
    assert stdout_matches("3\r\n", "3\n") and stdout_matches("1 2  \n\n", "1 2")
    assert stdout_matches("0.3333333", "0.33333333") and not stdout_matches("4", "3")
