"""Graders: is a response to an evaluation prompt correct?

    category   dataset(s)                     grader
    math       math500, aime(2024/2025)       `math_answers.grade_math` (last \\boxed{} + math-verify;
                                              AIME: integers)
    mc         gpqa, mmlu                     `choice.grade_choice` (robust letter extraction)
    code       humaneval, mbpp, lcb-v5/6      `code.grade_code` (the program and the tests in `sandbox`;
                                              `Grade.tests` names the tests that ran)

`grade(prompt, response_text)` picks the grader by `prompt.category` and returns a `Grade`.  A reasoning model's
response is graded on what follows its last "</think>" (`after_reasoning`), as lighteval and lm-eval-harness strip
the reasoning: a tentative answer in the thinking ("maybe \\boxed{4}?", "so the answer is A?") is not the answer
the response gives; a response without "</think>" (no reasoning, or one cut before it closed) is graded whole.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .choice import grade_choice
from .code import grade_code
from .math_answers import grade_math


@dataclass(frozen=True)
class Grade:
    """The grade of one response."""

    correct: bool
    extracted: str | None
    """What the grader compared: the final answer, the letter, or the program."""
    detail: str
    """Why (e.g. "no final answer", "test 2/3 failed: wall-clock timeout")."""
    grader: str
    """"math", "mc" or "code"."""
    tests: str | None = None
    """Code: which tests ran ("check (public)", "test_list (3 asserts)", LiveCodeBench: "public only" or
    "public+private"); None for math and multiple choice."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


REASONING_END = "</think>"


def after_reasoning(response: str) -> str:
    """The part of `response` after its last "</think>" (the answer a reasoning model gives); all of it when there
    is none."""
    cut = response.rfind(REASONING_END)
    return response if cut < 0 else response[cut + len(REASONING_END):]


def grade(prompt: Any, response: str) -> Grade:
    """Grade `response` (text) against `prompt` (an `eval.datasets.Prompt`), past its reasoning
    (`after_reasoning`)."""
    category = prompt.category
    response = after_reasoning(response)
    if category == "math":
        if prompt.answer is None:
            raise ValueError(f"{prompt.dataset} prompt {prompt.id} has no gold answer")
        ok, got, why = grade_math(response, prompt.answer, integer=prompt.dataset.startswith("aime"))
    elif category == "mc":
        ok, got, why = grade_choice(response, prompt.answer or "", len(prompt.choices or ()) or 4)
    elif category == "code":
        ok, got, why, tests = grade_code(response, prompt.dataset, prompt.extra)
        return Grade(correct=bool(ok), extracted=got, detail=why, grader=category, tests=tests)
    else:
        raise ValueError(f"no grader for category {category!r}")
    return Grade(correct=bool(ok), extracted=got, detail=why, grader=category)


__all__ = ["Grade", "after_reasoning", "grade", "grade_choice", "grade_code", "grade_math"]
