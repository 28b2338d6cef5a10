"""Math grading: the final answer of a response (the last \\boxed{} or a common final-answer phrase), compared
with the gold answer by math-verify (LaTeX / expression equivalence); AIME answers are integers 0-999.

    step                        code
    final answer of a response  extract_final_answer (last \\boxed{} / \\fbox{}, else "final answer is",
                                "answer:", "####", "answer is")
    equivalence                 same normalized string, else math_verify.verify(parse(gold), parse(answer))
    AIME                        integers compared as integers (gold "336^\\circ" -> 336)

math-verify bounds its work with signal.alarm, which exists only in the main thread: off the main thread
the timeouts are off (`forerun eval` grades in the main thread).
"""

from __future__ import annotations

import re
import threading

from math_verify import parse, verify

PARSE_TIMEOUT_S = 5
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_PHRASES = [
    re.compile(r"final answer is[:\s]*\$?([^\n$]+?)\$?\s*(?:\.\s|\.?$|\n)", re.I),
    re.compile(r"(?:^|\n)\s*\**answer\**\s*[:：]\s*\$?([^\n$]+?)\$?\s*\.?\s*(?:\n|$)", re.I),
    re.compile(r"####\s*([^\n]+)"),
    re.compile(r"answer is[:\s]*\$?([^\n$]+?)\$?\s*(?:\.\s|\.?$|\n)", re.I),
]


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) with balanced braces; None if there is none."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip()
    return None


def extract_final_answer(text: str) -> str | None:
    """The final answer of a response: the last \\boxed{}, else the last common final-answer phrase."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    for pattern in _PHRASES:
        found = pattern.findall(text)
        if found:
            return found[-1].strip().rstrip(".")
    return None


def normalize(answer: str) -> str:
    """A light textual normal form (spaces, \\left/\\right, \\dfrac, \\!, trailing period, enclosing $)."""
    s = answer.strip().strip("$").rstrip(".")
    for old, new in (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\!", ""),
                     ("\\,", ""), ("\\;", ""), ("\\ ", ""), ("^\\circ", ""), ("^{\\circ}", "")):
        s = s.replace(old, new)
    return re.sub(r"\s+", "", s)


def _as_integer(answer: str) -> int | None:
    s = normalize(answer)
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s)
    s = s.replace("{,}", "").replace(",", "")
    return int(s) if re.fullmatch(r"[+-]?\d+", s) else None


def equivalent(gold: str, answer: str) -> bool:
    """Is `answer` the same mathematical object as `gold` (math-verify; same normalized text counts)?"""
    if normalize(gold) == normalize(answer):
        return True
    main = threading.current_thread() is threading.main_thread()
    timeout = PARSE_TIMEOUT_S if main else None
    try:
        g = parse(f"${gold}$", parsing_timeout=timeout)
        a = parse(f"${answer}$", parsing_timeout=timeout)
        return bool(g and a and verify(g, a, timeout_seconds=timeout))
    except Exception:  # math-verify raises on pathological input; such an answer is not graded correct
        return False


def grade_math(response: str, gold: str, *, integer: bool = False) -> tuple[bool, str | None, str]:
    """(correct, extracted answer, detail) of a math response."""
    answer = extract_final_answer(response)
    if answer is None:
        return False, None, "no final answer"
    if integer:
        g, a = _as_integer(gold), _as_integer(answer)
        if g is not None and a is not None:
            return a == g, answer, "integer"
    return equivalent(gold, answer), answer, "math-verify"
