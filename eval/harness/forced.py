"""The forced-answer pass of `forerun eval --forced-answer` (off by default).

A small model (the default SmolLM2-135M) often runs out of its token budget, or rambles, without ever writing a
final answer: its accuracy then measures the budget, not the sampler.  The published harnesses (Karan & Du's
power-sampling evals, lighteval) therefore also grade a forced answer.  After the method's response, each item
gets ONE greedy continuation on the same runtime (engine or server) as the method:

    prefix   = prompt ids + response ids before its first EOS (the EOS itself dropped) + the forcing text's ids
    forced   = greedy continuation of prefix: at most `max_tokens` tokens, stopping at EOS
    graded   = response text + forcing text + forced text, by the dataset's grader (`eval.graders.grade`),
               exactly as a response is graded, but only the answer the forcing text opens (`graded_text`):
               math: the continuation up to the brace that closes the box the forcing text opens, so a later box
               (a next problem's "\\boxed{43}", a restart) cannot override it; a box never closed ends where its
               answer does ("42$ ...", "42\\n...", "42. ...") and is closed there, so its answer is graded, not an
               earlier box of the response or the rambling after it; mc: up to the end of its first
               non-blank line, so a later line (the options of a next question, "A) ...", a restart) cannot
               override it

    answer kind   datasets                    forcing text                   max_tokens
    math          math500, aime, aime2024/25  "\\n\\nFinal answer: $\\boxed{"    32 (the box it opens is read)
    mc            gpqa, mmlu                  "\\n\\nThe answer is ("           8  ("answer is (X" is read)
    code          humaneval, mbpp, lcb-v5/6   none: a program cannot be forced in a few tokens, so code items
                                              get no forced pass (their forced fields are null, the column –)

Record fields (next to the response's): `forced_text` (forcing text + continuation, all of it: the forced pass is
graded on `response + forced_text`, cut as said above), `forced_ids` (the continuation),
`forced_grade`, `forced_correct`, `forced_tokens` (tokens the forced pass decoded: never added to the method's
`tokens_decoded`), `forced_wall_s` (its time: outside the item's `wall_s`).  The run header's settings hold
`forced_answer`, and its `forced_answers` the forcing texts and budgets (`forcing_header`), so `--resume` refuses
a run made with the other choice, or with other forcing texts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from ...programs.completions import CompletionRequest, ProgramCompletionModel
from ..graders import REASONING_END
from .eos import cut_at_eos


@dataclass(frozen=True)
class ForcedAnswer:
    """How one answer kind is forced."""

    text: str
    """The forcing text appended after the response (the grader reads the answer it opens)."""
    max_tokens: int
    """The most tokens the greedy continuation may decode."""
    first_line: bool = False
    """Grade the continuation only up to the end of its first non-blank line (the answer the forcing text opens,
    not what a later line says)."""
    closes_box: bool = False
    """The forcing text ends inside a box ("\\boxed{"): grade the continuation only up to the brace that closes
    it (the answer the forcing text opens, not a later box)."""


FORCED_ANSWERS: dict[str, ForcedAnswer] = {
    "math": ForcedAnswer("\n\nFinal answer: $\\boxed{", 32, closes_box=True),
    "mc": ForcedAnswer("\n\nThe answer is (", 8, first_line=True),
}
"""Per answer kind (`Prompt.category`); a kind not listed (code) gets no forced pass."""


def forcing_header(on: bool) -> dict[str, dict[str, Any]] | None:
    """The run header's record of the forced pass: per answer kind its forcing text and token budget (None when
    the run has no forced pass)."""
    return {kind: {"text": f.text, "max_tokens": f.max_tokens} for kind, f in FORCED_ANSWERS.items()} if on else None


def forced_answer_for(category: str) -> ForcedAnswer | None:
    """How answers of `category` are forced, or None (code: no forced pass)."""
    return FORCED_ANSWERS.get(category)


def forced_prefix(prompt_ids: Sequence[int], response_ids: Sequence[int], eos_token_ids: Sequence[int],
                  forcing_ids: Sequence[int]) -> list[int]:
    """The ids the forced pass continues: the prompt, the response before its first EOS, the forcing text."""
    eos = {int(t) for t in eos_token_ids}
    kept = cut_at_eos(response_ids, eos)
    if kept and kept[-1] in eos:
        kept.pop()  # the EOS itself
    return [*(int(t) for t in prompt_ids), *kept, *(int(t) for t in forcing_ids)]


def room_left(forced: ForcedAnswer, prefix_len: int, max_context: int | None) -> int:
    """Tokens the forced continuation may decode: its budget, cut to what the model context leaves after the
    prefix (`Runtime.max_context`: the embedded model's, or a server's /v1/models); 0: none (the response filled the context, which --n allows), and the
    forced pass grades the response and forcing text alone, never an engine error that would fail the item."""
    return forced.max_tokens if max_context is None else max(0, min(forced.max_tokens, max_context - prefix_len))


def forced_text(forced: ForcedAnswer, continuation_text: str) -> str:
    """What the forced pass adds after the response: the forcing text and the continuation (graded as
    response + this)."""
    return forced.text + continuation_text


_ANSWER_END = re.compile(r"(?<!\\)\$|\n|(?<!\.)\.(?=\s|$)")
"""Where an answer in a box that never closes ends: the "$" closing the inline math the forcing text opened (not
an escaped "\\$"), a line break, or a sentence's full stop ("42. This is because ...")."""


def through_closing_brace(text: str) -> str:
    """`text` up to and including the "}" that closes a brace opened before it (braces counted as the math grader
    balances them, escaped or not).  When that brace never closes: `text` up to the end of the answer
    (`_ANSWER_END`, outside braces opened in it, or the end of `text`) with the braces still open there closed,
    so the grader reads what was written inside the box ("42$ and the next ..." -> "42}"); all of it unchanged
    when nothing but spaces is written before that end (no forced answer: the response's own is graded)."""
    depth = 1
    for i, c in enumerate(text):
        depth += (c == "{") - (c == "}")
        if depth == 0:
            return text[:i + 1]
    depth, end, first = 1, len(text), len(text) - len(text.lstrip())  # the answer may start on a later line
    for i, c in enumerate(text):
        if depth == 1 and i >= first and _ANSWER_END.match(text, i):
            end = i
            break
        depth += (c == "{") - (c == "}")
    answer = text[:end].rstrip()
    return answer + "}" * (answer.count("{") - answer.count("}") + 1) if answer.strip() else text


def graded_text(forced: ForcedAnswer, continuation_text: str) -> str:
    """What of the forced pass is graded after the response: the forcing text and the continuation, cut where the
    continuation closes a reasoning block ("</think>": the grader reads past the last one), then after its first
    non-blank line where `forced.first_line`, after the brace closing the opened box where `forced.closes_box`."""
    continuation_text = continuation_text.split(REASONING_END, 1)[0]  # graded past the reasoning: cut there
    if forced.first_line:
        continuation_text = re.sub(r"(?s)(\S[^\n]*)\n.*", r"\1", continuation_text, count=1)
    if forced.closes_box:
        continuation_text = through_closing_brace(continuation_text)
    return forced.text + continuation_text


def greedy_continuation(backend: Any, prefix_ids: Sequence[int], max_tokens: int) -> list[int]:
    """One greedy completion of `prefix_ids` on `backend` (at most `max_tokens`, stops at EOS): its ids."""
    (out,) = ProgramCompletionModel(backend).complete([CompletionRequest(tuple(prefix_ids), max_tokens, 0.0, 0)])
    return [int(t) for t in out.ids]
