"""Every multiple-choice row of the offline MMLU and GPQA Diamond copies: the gold letter is the letter the chat
message puts before the correct choice's text.

The oracle reads the raw columns itself (json / csv, not the package's parsers) and finds the expected letter in
the message the model is shown.  GPQA rows are never printed or stored: a failure names the Record ID only.
"""

from __future__ import annotations

import collections
import csv
import json
from pathlib import Path

import pytest

from forerun.eval.datasets.loading import load_prompts, resolve_data_dir

INCORRECT = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")


@pytest.fixture(scope="module")
def shared() -> Path:
    src = resolve_data_dir()
    if src.packaged:
        pytest.skip("the full offline datasets (shared/datasets or FORERUN_DATA_DIR) are not available here")
    return src.path


def _letters_before(message: str, text: str) -> list[str]:
    """The option letters whose line in `message` holds exactly `text` (an option is "\\nL) text\\n")."""
    return [letter for letter in "ABCDEFGHIJ" if f"\n{letter}) {text}\n" in message]


def test_every_mmlu_gold_letter_is_the_letter_of_its_correct_choice(shared):
    raw: dict[tuple[str, tuple[str, ...]], set[int]] = collections.defaultdict(set)
    with open(shared / "mmlu_test.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            raw[(row["question"], tuple(row["choices"]))].add(row["answer"])
    prompts = load_prompts("mmlu", data_dir=shared)
    assert len(prompts) == sum(1 for _ in open(shared / "mmlu_test.jsonl", encoding="utf-8")) == 14042
    wrong = []
    for p in prompts:
        (answer,) = raw[(p.question, p.choices)]  # one gold per (question, choices) in the raw file
        expected = "ABCD"[answer]  # the file's documented mapping: answer index 0-3 -> A-D
        message = p.user_message()
        correct = p.choices[answer].strip()
        if p.answer != expected or expected not in _letters_before(message, correct):
            wrong.append((p.id, p.answer, expected))
        for letter, choice in zip("ABCD", p.choices):  # every option listed, in the order the letters name
            assert letter in _letters_before(message, choice.strip()), p.id
    assert not wrong, f"{len(wrong)} MMLU rows whose gold letter is not their correct choice's: {wrong[:5]}"


def test_every_gpqa_gold_letter_is_the_letter_of_its_correct_answer(shared):
    with open(shared / "gpqa_diamond.csv", encoding="utf-8", newline="") as fh:
        rows = {r["Record ID"]: r for r in csv.DictReader(fh)}
    prompts = load_prompts("gpqa", data_dir=shared)
    assert len(prompts) == len(rows) == 198 and {p.id for p in prompts} == set(rows)
    wrong, placements = [], collections.Counter()
    for p in prompts:
        row = rows[p.id]
        message = p.user_message()
        at = _letters_before(message, row["Correct Answer"].strip())
        if len(at) != 1 or p.answer != at[0]:
            wrong.append(p.id)  # the Record ID only: GPQA text is never printed
            continue
        placements[at[0]] += 1
        others = {letter for k in INCORRECT for letter in _letters_before(message, row[k].strip())}
        if others != set("ABCD") - {at[0]}:  # the three incorrect answers fill the other three letters
            wrong.append(p.id)
    assert not wrong, f"{len(wrong)} GPQA rows whose gold letter is not their correct answer's: {wrong[:5]}"
    assert set(placements) == set("ABCD")  # shuffled, not always the first letter
    # reproducible: the same seed gives the same messages, whether loaded whole, in part, or from the file itself
    again = load_prompts("gpqa", file=shared / "gpqa_diamond.csv", limit=20)
    assert [(p.answer, p.user_message()) for p in again] == [(p.answer, p.user_message()) for p in prompts[:20]]
