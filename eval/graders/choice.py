"""Multiple-choice grading: a robust extraction of the chosen letter, compared with the gold letter.

Patterns, strongest first (the last match of the first pattern that matches wins): \\boxed{X} (also
\\boxed{\\text{X}}, \\boxed{(X)}, \\boxed{X) text}); "answer is X" / "answer: X" / "correct option is X"
(with optional bold, parentheses); a final line that is only the letter ("C", "(C)", "C)", "C."); the last "(C)" anywhere. Only
letters of the question's options count (A-D for four options).
"""

from __future__ import annotations

import re

LETTERS = "ABCDEFGHIJ"


def _patterns(valid: str) -> list[re.Pattern[str]]:
    v = f"[{valid}]"
    return [
        re.compile(rf"\\boxed\s*\{{\s*(?:\\text(?:bf)?\s*\{{\s*)?\(?({v})\b"),
        re.compile(rf"(?i:answer|option|choice)\s*(?i:is|would be|=)?\s*[:：]?\s*\**\s*\(?({v})\b(?![-'])"),
        re.compile(rf"(?:^|\n)\s*\**\(?({v})[).:]?\**\s*$"),
        re.compile(rf"\(({v})\)"),
    ]


def extract_choice(text: str, num_choices: int = 4) -> str | None:
    """The chosen letter, or None."""
    valid = LETTERS[: max(1, min(num_choices, len(LETTERS)))]
    for pattern in _patterns(valid):
        found = pattern.findall(text)
        if found:
            return found[-1].upper()
    return None


def grade_choice(response: str, gold: str, num_choices: int = 4) -> tuple[bool, str | None, str]:
    """(correct, extracted letter, detail) of a multiple-choice response."""
    letter = extract_choice(response, num_choices)
    if letter is None:
        return False, None, "no letter"
    return letter == gold.strip().upper(), letter, "letter"
