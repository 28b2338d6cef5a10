"""Multiple-choice grading: the chosen letter of a response, compared with the gold letter.

Two tiers; within a tier the LAST match wins (a response that changes its mind ends with the answer it
means):

    tier       what counts                                                    examples
    explicit   \\boxed{X} (also \\boxed{\\text{X}}, \\boxed{\\mathbf{X}}, \\boxed{(X)},     "The answer is (b)."
               \\boxed{X) text}, \\fbox{X}), "answer is X" / "answer: X" /         "answer: c"
               "final answer: X" / "correct option is X" / "the answer must be   "Final answer: B"
               X" (also "$\\text{X}$", "\\textbf{X}"), "option X is correct", "X is (the)   "B) 42 is the only
               correct (answer)", "X is the answer", "I choose X", "I'd go with   value that works."
               X", the letter quoted or bracketed ("the answer is \"C\"", "answer:
               [B]"), and a final line that starts with the letter as a label
               ("B) ...", "(B)", "B.", "**B**", "B"; not the last item of a restated
               option list, "C. 7" then "D. 8"), and a conclusion that ends its
               sentence on one capital letter: "so B." / "hence (B)" / "therefore,
               B" / "leaving B." / "which leaves B" / "it must be B" / "it's B."
               (after an elimination, "A is wrong, C is wrong, D is wrong, so B";
               not "so B and C", "so B is wrong", "so b"; one other letter set
               aside before the sentence ends is allowed: "it is B, not C.",
               and as a final line, "B, not C.")
    mention    the letter written as an option anywhere else: "(C)", "C)", "option C", "**C**" (not a
               function's argument: "P(B)", "f(a)"; not the labels of a restated option list, "A) 1 / B) 2 /
               C) 3 / D) 4" one a line, unless only one of them stands outside a negation)

A letter in a negation does not count in either tier: "not A", "rule out B", "A is wrong / incorrect /
false / not ...", "Option A is wrong" (the clause around the letter, up to , ; . ! ? or a line break; neither
a negation of a later letter, "C and not D", "C (not A)", nor one in a justifying clause after the letter,
"C because the reaction is not spontaneous", is one of C; nor what follows a colon or dash that names a
subject of its own, "B: the others fail", "B - A is wrong"; nor a negation before a colon or dash that opens an
answer statement, "my first guess was wrong: the answer is C").  So a response that only rules options out gets
no letter, and "The answer is B, not A" is B.  Nor does a letter named together with another one in either tier
("The answer is B or C", "(A) and (C)", "B/C", "\\boxed{B, C}": a hedge, no choice), unless the other is negated
("B and not C", "B, and C is wrong"); nor one given as an example ("for example \\boxed{A}", the instruction
echoed).  Lowercase letters count ("(b)", "answer: c"),
except the article: "the answer is a number" is not A.  Only the question's letters count (A-D for four
options).
"""

from __future__ import annotations

import re

LETTERS = "ABCDEFGHIJ"
_ANSWER = (r"(?:final\s+answer|correct\s+(?:answer|option|choice)|best\s+(?:answer|option|choice)|right\s+answer|"
           r"my\s+(?:answer|choice)|answer)")
_VERB = r"(?:\s+(?:is|would\s+be|must\s+be|should\s+be|will\s+be|is\s+therefore|is\s+clearly|=))?"
_OPEN = (r"[\s:：=]*+(?:\*\*|__)?\s*+(?:(?:\$|\\\()\s*+)?(?:\\(?:text|math)(?:bf|rm|it|sf|tt|normal)?\s*+\{\s*+)?"
         r"(?:(?:option|choice)\s+)?(?:\*\*)?\(?\s*+")
"""Possessive (*+): a run of spaces is read one way only (three ways to share it out made a long one cubic)."""
_SET_ASIDE = r"(?:,?\s*\(?(?i:not|rather\s+than|instead\s+of)\s+(?:(?i:option|choice)\s+)?\(?[A-J]\)?\)?)"
"""One other letter set aside after the answer, to the end of the sentence ("it is B, not C."; "B (not A)")."""
_EXPLICIT = [
    r"\\(?:boxed|fbox)\s*\{\s*(?:\\(?:text|math)(?:bf|rm|it|sf|tt|normal)?\s*\{\s*)?(?:\\?\(\s*)?(?P<l>[A-Za-z])\b",
    rf"(?i:\b{_ANSWER}{_VERB}){_OPEN}(?P<l>[A-Za-z])\b(?!['’-])",
    rf"(?i:\b{_ANSWER}{_VERB})[\s:：=]*(?:\*\*)?[\"'“‘\[]\s*(?P<l>[A-Za-z])\s*[\"'”’\]]",  # "C", 'D', [B]
    r"(?i:\b(?:option|choice))\s+\(?(?P<l>[A-Za-z])\)?\s+(?i:is\s+(?:the\s+)?(?:correct|right|best|true)\b)",
    r"(?:^|[\s(*])\(?(?P<l>[A-Z])\)?\**\s+"
    r"(?i:is\s+(?:the\s+)?(?:(?:correct|right|best)(?:\s+(?:answer|option|choice))?|answer)\b)",
    r"(?i:\bI\s*(?:['’](?:ll|d)|\s+will|\s+would)?\s+(?:choose|pick|select|go\s+with))\s+(?i:option\s+)?\(?(?P<l>[A-Za-z])\b",
    r"(?i:\b(?:so|thus|hence|therefore|leaving|(?:which|that|this)\s+leaves|it\s+(?:must|has\s+to)\s+be|"
    r"it['’]s|it\s+is))[,:]?\s+"
    rf"(?i:(?:option|choice)\s+)?\(?(?P<l>[A-Z])\b\)?(?={_SET_ASIDE}?\s*(?:[.!\n]|$))",  # a conclusion: "..., so B."
]
_FINAL_LINE = re.compile(r"^\s*(?:[-*>]\s+)?(?:\*\*|__)?\s*(?i:option\s+)?\(?\s*(?P<l>[A-Za-z])\s*"
                         rf"(?:\)|\.|:|\*\*|$|{_SET_ASIDE}\s*[.!]?\s*$)")
_MENTIONS = [r"(?<![A-Za-z0-9_])\((?P<l>[A-Za-z])\)", r"(?:^|[\s*])(?P<l>[A-Z])\)",
             r"(?i:\b(?:option|choice))\s+(?P<l>[A-Z])\b", r"\*\*(?P<l>[A-Z])\*\*"]
"""The first one not after a letter or digit: "P(B)" and "f(a)" are a function's argument, not an option."""
_NEG_BEFORE = re.compile(r"(?i:\b(?:not|never|rule[sd]?\s+out|ruling\s+out|eliminat\w*|exclud\w*|rather\s+than|"
                         r"instead\s+of|except|neither|nor|wrong|incorrect|false)\b|n't\b)")
_NEG_AFTER = re.compile(r"(?i:\b(?:not|wrong|incorrect|false|invalid|ruled\s+out|eliminated|excluded|impossible|"
                        r"unlikely|fails?|doesn't|does\s+not|isn't|cannot|can't)\b)")
_CLAUSE = re.compile(r"[,;.!?\n]")
_REASON = re.compile(r"(?i:\b(?:because|since|(?<!well\s)(?<!such\s)as(?!\s+well\b)|given|due\s+to|whereas|unlike)\b)")
"""A justifying clause after the letter ("C because the reaction is not spontaneous"): what it negates is not
the letter."""
_ANOTHER_SUBJECT = re.compile(r"\s*(?::|-\s|[–—])\s*(?:(?i:(?:all\s+)?(?:the\s+)?(?:others|"
                              r"other\s+(?:options|choices|answers|ones)|rest|remaining\s+(?:options|choices|ones))|"
                              r"everything\s+else)\b|(?:(?i:option|choice)\s+)?\(?[A-J]\b)")
"""After the letter, a colon or dash and a subject of its own ("B: the others fail", "B - A is wrong"): what
follows is said of that subject, not of the letter."""
_NEW_STATEMENT = re.compile(rf"(?:[:：–—]|\s-)\s*(?:\*\*|__)?\s*(?i:(?:the|my)\s+)?(?i:{_ANSWER})\b")
"""A colon or dash that opens an answer statement ("that was wrong: the answer is C"): a negation before it is
about what came before (the model's earlier answer), not the letter the statement gives."""
_NEGATES_ANOTHER = re.compile(r"(?i:\b(?:not|never|rather\s+than|instead\s+of|except)\s+(?:(?:option|choice)\s+)?)"
                              r"\(?[A-J]\b\)?")
"""A negation of the next letter ("A and not B", "C (not A)"): it says nothing against the letter before it."""


def _negated(text: str, start: int, end: int) -> bool:
    """Is the letter at text[start:end] inside a negation (its clause says it is wrong)?"""
    cut = max((m.end() for m in _CLAUSE.finditer(text, max(0, start - 80), start)), default=max(0, start - 80))
    before = text[cut:start]
    before = before[max((m.start() + 1 for m in _NEW_STATEMENT.finditer(before)), default=0):]
    after = text[end:end + 80]
    m = _CLAUSE.search(after)
    after = after[: m.start()] if m else after
    m = _REASON.search(after)
    after = after[: m.start()] if m else after
    after = after.split(")", 1)[-1] if after.lstrip().startswith(")") else after
    after = "" if _ANOTHER_SUBJECT.match(after) else after
    after = _NEGATES_ANOTHER.sub(" ", after)
    return bool(_NEG_BEFORE.search(before) or _NEG_AFTER.search(after))


_JOIN = r"(?:,\s*(?:(?:or|and)\s+)?|(?:or|and)\s+|[/&]\s*)"
_OTHER = r"(?:(?i:option|choice)\s+)?(?:\*\*)?(?:\((?P<o>[A-Ja-j])\)|\(?(?P<O>[A-J])\b\)?)(?:\*\*)?"
_JOINED_AFTER = re.compile(rf"\)?(?:\*\*)?\s*{_JOIN}{_OTHER}(?=\s*(?:[.,;:!?\n}}$]|$|(?:or|and|are)\b))")
_JOINED_BEFORE = re.compile(rf"(?:^|(?<=[\s(*:]))(?:(?:option|choice)\s+)?(?:\*\*)?"
                            rf"(?:\((?P<o>[A-Ja-j])\)|(?P<O>[A-J])\)?)(?:\*\*)?\s*{_JOIN}"
                            rf"(?:(?:option|choice)\s+)?(?:\*\*)?\(?\s*$")
"""A letter joined to another by ",", "or", "and", "/" or "&" ("The answer is B or C", "(A) and (C)"): one of
several letters named together, a hedge, not a choice (the other letter not negated: "B and not C" is B, "B, and C
is wrong" is B)."""


def _one_of_several(text: str, start: int, end: int, valid: str) -> bool:
    """Is the letter at text[start:end] named together with another valid letter that is not negated?"""
    letter = text[start:end].upper()
    after = _JOINED_AFTER.match(text, end)
    before = _JOINED_BEFORE.search(text, max(0, start - 40), start)
    for m in (after, before):
        if m is None:
            continue
        group = "o" if m.group("o") else "O"
        other = m.group(group).upper()
        if other != letter and other in valid and not _negated(text, m.start(group), m.end(group)):
            return True
    return False


def _letter(m: re.Match[str], valid: str) -> str | None:
    raw = m.group("l")
    if raw.upper() not in valid:
        return None
    if raw == "a" and re.match(r"\s+[A-Za-z]", m.string[m.end("l"):]):
        return None  # the article: "the answer is a number"
    return raw.upper()


_EXAMPLE_BEFORE = re.compile(r"(?i:\b(?:for\s+example|for\s+instance|e\.\s?g\.|such\s+as))\s*[:,]?\s*(?:\$\s*)?\Z")
"""What introduces an example, not an answer: the instruction's "within \\boxed{}, for example \\boxed{A}", echoed."""


def _last(text: str, patterns: list[re.Pattern[str]], valid: str, after: int = -1,
          skip: frozenset[int] = frozenset()) -> tuple[int, str] | None:
    """The last match of any pattern that names a valid letter outside a negation (and starts past `after`; a
    letter starting at a position in `skip` does not count)."""
    matches = sorted(((m.start("l"), m) for p in patterns for m in p.finditer(text)), key=lambda x: -x[0])
    for start, m in matches:
        if start <= after:
            return None
        if start in skip or _EXAMPLE_BEFORE.search(text, max(0, m.start() - 40), m.start()):
            continue
        letter = _letter(m, valid)
        if letter and not _negated(text, start, m.end("l")) and not _one_of_several(text, start, m.end("l"), valid):
            return start, letter
    return None


_EXPLICIT_RE = [re.compile(p, re.M) for p in _EXPLICIT]
_MENTION_RE = [re.compile(p, re.M) for p in _MENTIONS]


_LABEL_LINE = re.compile(r"^[ \t]*(?:[-*>][ \t]+)?(?:\*\*|__)?\(?(?P<l>[A-J])(?:\)|\.|:)", re.M)


def _restated_option_lists(text: str) -> frozenset[int]:
    """Where the labels of a restated option list start ("A) 1\\nB) 2\\nC) 3\\nD) 4": lines labelled with successive
    letters, blank lines between allowed) in which more than one label stands outside a negation: the options
    repeated, not a choice among them (their last label read D for any echo of the question).  A list that keeps
    one label ("(A): incorrect\\n(B): correct\\n(C): incorrect") names that one."""
    runs: list[list[re.Match[str]]] = []
    for m in _LABEL_LINE.finditer(text):
        last = runs[-1][-1] if runs else None
        line_end = text.find("\n", last.end()) if last is not None else -1
        if (last is not None and ord(m.group("l")) == ord(last.group("l")) + 1
                and 0 <= line_end < m.start() and not text[line_end:m.start()].strip()):
            runs[-1].append(m)  # the next line (blank lines between) has the next letter
        else:
            runs.append([m])
    lists = [run for run in runs if len(run) > 1]
    return frozenset(m.start("l") for run in lists
                     if sum(not _negated(text, m.start("l"), m.end("l")) for m in run) > 1 for m in run)


def _continues_an_option_list(m: re.Match[str], previous: str | None) -> bool:
    """Whether the final line's label follows the line before it alphabetically ("C. 7" then "D. 8"): the end
    of a restated list of options, not a final answer."""
    before = _FINAL_LINE.match(previous) if previous is not None else None
    return before is not None and ord(m.group("l").upper()) == ord(before.group("l").upper()) + 1


def extract_choice(text: str, num_choices: int = 4) -> str | None:
    """The chosen letter, or None."""
    valid = LETTERS[: max(1, min(num_choices, len(LETTERS)))]
    found = None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines:
        offset = text.rfind(lines[-1])
        m = _FINAL_LINE.match(lines[-1])
        if m and not _continues_an_option_list(m, lines[-2] if len(lines) > 1 else None):
            letter, start = _letter(m, valid), offset + m.start("l")
            end = offset + m.end("l")
            if letter and not _negated(text, start, end) and not _one_of_several(text, start, end, valid):
                found = (start, letter)
    found = _last(text, _EXPLICIT_RE, valid, found[0] if found else -1) or found
    if found is None:
        found = _last(text, _MENTION_RE, valid, skip=_restated_option_lists(text))
    return found[1] if found else None


def grade_choice(response: str, gold: str, num_choices: int = 4) -> tuple[bool, str | None, str]:
    """(correct, extracted letter, detail) of a multiple-choice response."""
    letter = extract_choice(response, num_choices)
    if letter is None:
        return False, None, "no letter"
    return letter == gold.strip().upper(), letter, "letter"
