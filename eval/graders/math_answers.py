"""Math grading: the final answer of a response (the last \\boxed{} or a common final-answer phrase), compared
with the gold answer by math-verify (LaTeX / expression equivalence); AIME answers are integers 0-999.

    step                        code
    final answer of a response  extract_final_answer (last \\boxed{} / \\fbox{} not empty, with the boxes joined to it
                                by ",", "and", "or" as math-verify joins them: "$x=\\boxed{2}$ or
                                $x=\\boxed{3}$" is the list "2, 3"; else what follows
                                "final answer is", "answer:", "####", "answer is": a display formula
                                (\\[...\\], $$...$$), else the sentence without markdown emphasis, math
                                delimiters or a justifying ", since ..." clause); fallback when there is none:
                                math-verify's own extraction from the whole response (`parse(response)`:
                                its last LaTeX expression or number, as lighteval does), e.g. "So there are
                                42 ways." -> 42.  The grade's detail says which one was used.
    equivalence                 same normalized string, else math_verify.verify(parse(gold), parse(answer)),
                                a set and a relation of one variable that solves to it comparing equal in
                                either direction ("3 < x \\le 4" answers the gold "(3,4]"; by default
                                math-verify took only the gold relation against an answered set);
                                an answer that is a number followed by unit words ("12 cm^2", "5 meters",
                                which math-verify reads as 12*c*m^2) is compared by its number; one written
                                wholly as text ("\\text{5 inches}", "\\text{0.5}") by the math inside
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
_PHRASES = [  # each ends where its answer starts; earlier phrases take precedence
    re.compile(r"final answer is[:\s]*", re.I),
    re.compile(r"(?:^|\n)[ \t]*[*_]*(?:final\s+)?answer[*_]*\s*[:：]\s*", re.I),
    re.compile(r"####[ \t]*"),
    re.compile(r"answer is[:\s]*", re.I),
]
_DISPLAY_MATH = re.compile(r"\s*(?:\$\$(.+?)\$\$|\\\[(.+?)\\\])", re.S)
"""A display formula right after the phrase, possibly on the next lines: "The answer is:\n\\[ \\frac12 \\]"."""
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
_REASON_CLAUSE = re.compile(r",\s+(?:since|because|as|which|so|where|given|thus|hence|therefore|i\.e\.)\b.*"
                            r"|[,;]\s+not\b.*", re.I)
"""A clause that justifies the answer ("42, since 6*7=42") or sets another aside ("42, not 41"): not part of it."""
_NEGATED = re.compile(r"not\b[^;,]*[;,]\s*(?:but\s+)?(?:(?:it\s+is|it's|rather|instead)[:\s]+)?|not\b.*", re.I)
"""A phrase whose answer is negated: what the sentence gives instead ("The answer is not 41; it is 42." -> "42"); with
nothing instead ("The answer is not 41.") the answer is "not 41", which equals no number."""
_MARKUP = "*_ \t"
"""Markdown emphasis around an answer ("**42**")."""
_INLINE_MATH = re.compile(r"\$|\\\(")


_EMPTY_BOX = re.compile(r"\s*\}")
"""A box with nothing in it ("\\boxed{}"): the instruction "put your final answer within \\boxed{}" echoed, no
answer."""


def _closed_boxes(text: str) -> list[tuple[int, int, int]]:
    """(where the macro starts, where its content starts, its closing brace) of each \\boxed{...} / \\fbox{...}
    whose braces balance and that holds something, in order."""
    found = [(m.start(), m.end()) for m in _BOXED.finditer(text)]
    if not found:
        return []
    closing, open_at = {}, []  # each "{" -> its matching "}", in one pass (a scan per \boxed was quadratic)
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            open_at.append(m.start())
        elif open_at:
            closing[open_at.pop()] = m.start()
    return [(macro, start, closing[start - 1]) for macro, start in found
            if start - 1 in closing and not _EMPTY_BOX.match(text, start)]


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) with balanced braces; None if there is none."""
    boxes = _closed_boxes(text)
    return text[boxes[-1][1]:boxes[-1][2]].strip() if boxes else None


_JOINED_BOXES = re.compile(r"\s*(?:\$\$?|\\[\])])?\s*(?:,?\s*(?:and|or)|,)\s*(?:\$\$?|\\[\[(])?\s*"
                           r"(?:[A-Za-z](?:_\{?\w+\}?)?\s*=\s*)?")
"""What joins the boxes of one answer written box by box, as math-verify reads them: "$x = \\boxed{2}$ or
$x = \\boxed{3}$", "\\boxed{2}, \\boxed{3}" (its boxed math joined by ",", "and" or "or", up to six: a set)."""


def final_boxed(text: str) -> str | None:
    """The last \\boxed{} answer: the last box, with the boxes joined to it by ",", "and" or "or" (at most six
    in all, as math-verify joins them) written as one list ("2, 3"); None if there is no closed box."""
    boxes = _closed_boxes(text)
    if not boxes:
        return None
    chain = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        gap = text[box[2] + 1:chain[0][0]]
        if len(chain) == 6 or box[2] >= chain[0][0] or len(gap) > 40 or not _JOINED_BOXES.fullmatch(gap):
            break
        chain.insert(0, box)
    return ", ".join(text[start:close].strip() for _, start, close in chain)


def _answer_after(text: str, start: int) -> str | None:
    """The answer written right after a final-answer phrase that ends at `start`: a display formula, else
    the rest of the sentence without markdown emphasis, math delimiters, a justifying clause or a negated one
    ("The answer is 42, not 41", "The answer is not 41; it is 42": 42)."""
    tail = text[start:].lstrip(_MARKUP + ":：")
    display = _DISPLAY_MATH.match(tail)
    if display:
        return (display.group(1) or display.group(2)).strip() or None
    line = tail.split("\n", 1)[0]
    negated = _NEGATED.match(line)
    if negated and line[negated.end():].strip(" ."):  # nothing instead: "not 41" stays, read as no number
        line = line[negated.end():]
    end = _SENTENCE_END.search(line)
    line = _REASON_CLAUSE.sub("", line[: end.start()] if end else line).strip(_MARKUP).rstrip(".")
    if _INLINE_MATH.search(line):  # "$\\frac12$ cm", "$2$ or $3$": math-verify's reading of the formulas
        try:
            parsed = parse(line, parsing_timeout=_timeout())
        except Exception:  # pathological input: keep the text
            parsed = []
        if len(parsed) > 1 and str(parsed[1]).strip():
            line = str(parsed[1])
    return line.strip().strip("$").strip() or None


def extract_final_answer(text: str) -> str | None:
    """The final answer of a response: the last \\boxed{}, else what follows the last common final-answer
    phrase (the first kind of phrase, in `_PHRASES` order, that the response uses)."""
    boxed = final_boxed(text)
    if boxed is not None:
        return boxed
    for pattern in _PHRASES:
        for m in reversed(list(pattern.finditer(text))):
            answer = _answer_after(text, m.end())
            if answer is not None:
                return answer
    return None


def normalize(answer: str) -> str:
    """A light textual normal form (spaces, \\left/\\right, \\dfrac, \\!, trailing period, enclosing $)."""
    s = answer.strip().strip("$").rstrip(".")
    for old, new in (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\!", ""),
                     ("\\,", ""), ("\\;", ""), ("\\ ", ""), ("^\\circ", ""), ("^{\\circ}", "")):
        s = s.replace(old, new)
    return re.sub(r"\s+", "", s)


def vote_key(answer: str) -> str:
    """What equal answers share in a majority vote: of the math the answer is graded as (`_graded_as`: "\\text{5
    inches}" and "5 inches" are 5), the integer it writes ("042", "42", "\\text{42}" are one vote), else its
    `normalize`d text."""
    answer = _graded_as(answer)
    n = _as_integer(answer)
    return f"int:{n}" if n is not None else normalize(answer)


def _as_integer(answer: str) -> int | None:
    """The integer an answer writes ("042", "1{,}000", "\\text{7}"), or None; a comma counts only as a
    thousands separator ("2, 5" is two numbers, not 25)."""
    s = normalize(answer)
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s).replace("{,}", ",")
    if not re.fullmatch(r"[+-]?(?:\d+|\d{1,3}(?:,\d{3})+)", s):
        return None
    return int(s.replace(",", ""))


def _timeout() -> int | None:
    return PARSE_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


_UNIT = r"[A-Za-z]{2,}(?:\^\d)?"
_WITH_UNITS = re.compile(rf"\s*([-+]?\d[\d,]*(?:\.\d+)?)\s+({_UNIT}(?:(?:\s+|(?<=\d)){_UNIT})*)\s*\.?\s*")
"""A number followed by unit words ("12 cm^2", "5 meters"), which math-verify reads as a product of symbols.
Words are split at spaces (or after an exponent) only: one way to read a run of letters, so a long one that
does not match fails at once (a word that may split anywhere made "1 aaaa...a!" backtrack for hours)."""
_NOT_UNITS = {"pi", "sin", "cos", "tan", "log", "ln", "exp", "sqrt", "or", "and", "to", "times", "plus", "minus"}


_IN_TEXT = re.compile(r"\s*\\(?:text(?:rm|bf|normal)?|mbox|mathrm)\s*\{([^{}]*)\}(\^\{?\d\}?)?\s*\.?\s*")
"""An answer written wholly as text, with a number in it ("\\text{5 inches}", "\\text{0.5}", "\\mbox{5 cm}^2"):
math-verify reads it as a string (or "5inches"), never as the number."""


_OPEN_ENDED = re.compile(r"\b(?:or|and)\s+(?:more|less|fewer|greater|larger|smaller|higher|lower|above|below|over|"
                         r"under)\b", re.IGNORECASE)
"""A bound written in words ("5 or more", "5 \\text{ or fewer}"): math-verify reads the number alone (5), but the
answer is a range of numbers."""


def equivalent(gold: str, answer: str) -> bool:
    """Is `answer` the same mathematical object as `gold` (math-verify; same normalized text counts)?  An answer
    written wholly as text with a number in it is also read as the math it writes ("\\text{5 inches}" is 5 inches,
    read as 5).  A bound in words ("5 or more") is never a gold that has none."""
    if _OPEN_ENDED.search(answer) and not _OPEN_ENDED.search(gold):
        return False
    if _equivalent_as_written(gold, answer):
        return True
    inside = _text_inside(answer)
    return inside is not None and _equivalent_as_written(gold, inside)


def _text_inside(answer: str) -> str | None:
    """The math inside an answer written wholly as text with a number in it ("\\text{5 inches}" -> "5 inches"),
    None for any other answer."""
    text = _IN_TEXT.fullmatch(answer)
    return text.group(1) + (text.group(2) or "") if text and re.search(r"\d", text.group(1)) else None


def _number_of(answer: str) -> str | None:
    """The number of a number followed by unit words ("12 cm^2" -> "12"), None for any other answer."""
    unit = _WITH_UNITS.fullmatch(answer)
    return unit.group(1) if unit and not set(unit.group(2).lower().replace("^", " ").split()) & _NOT_UNITS else None


def _graded_as(answer: str) -> str:
    """What `equivalent` compares when the answer as written differs from the gold: a text answer's math, a
    number with units by its number."""
    answer = _text_inside(answer) or answer
    return _number_of(answer) or answer


def _equivalent_as_written(gold: str, answer: str) -> bool:
    if normalize(gold) == normalize(answer):
        return True
    timeout = _timeout()
    try:
        g = parse(f"${gold}$", parsing_timeout=timeout)
        a = parse(f"${answer}$", parsing_timeout=timeout)
        if g and a and verify(g, a, timeout_seconds=timeout, allow_set_relation_comp=True):
            return True
        number = _number_of(answer)
        if g and number is not None:
            a = parse(f"${number}$", parsing_timeout=timeout)  # "12 cm^2": the number without its units
            return bool(a and verify(g, a, timeout_seconds=timeout, allow_set_relation_comp=True))
        return False
    except Exception:  # math-verify raises on pathological input; such an answer is not graded correct
        return False


def fallback_answer(text: str) -> str | None:
    """math-verify's extraction from the whole response (its last LaTeX expression or number), or None."""
    try:
        parsed = parse(text, parsing_timeout=_timeout())
    except Exception:  # pathological input: no answer
        return None
    return parsed[1] if len(parsed) > 1 and str(parsed[1]).strip() else None


def grade_math(response: str, gold: str, *, integer: bool = False) -> tuple[bool, str | None, str]:
    """(correct, extracted answer, detail) of a math response."""
    answer, how = extract_final_answer(response), ""
    if answer is None:
        answer, how = fallback_answer(response), " (fallback: math-verify's extraction)"
    if answer is None:
        return False, None, "no final answer"
    if integer:
        g, a = _as_integer(gold), _as_integer(answer)
        if g is not None and a is not None:
            return a == g, answer, "integer" + how
    return equivalent(gold, answer), answer, "math-verify" + how
