"""Upstream rows -> `Prompt`s: one public parser per dataset, shared by the offline reader (`loading`) and
the hub reader (`hub`), so a prompt is the same object whichever way it was read.

Each parser takes the row and `where` (file:line or hub:source[i], named in every error).  GPQA's answer
choices are shuffled per question with a `random.Random` seeded from sha256(f"{seed}:{Record ID}"): the
order does not depend on which rows or how many are loaded.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from typing import Any

from .prompt import LETTERS, Prompt
from .registry import DatasetError

MBPP_TEST_IDS = range(11, 511)
"""The standard MBPP test split of the full set: task_id 11-510."""


def require_field(row: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """`row[key]`, which must be present, non-null and of `kind`; otherwise a `DatasetError` naming `where`."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if key not in row or row[key] is None:
        raise DatasetError(f"{where}: missing field {key!r}")
    val = row[key]
    if not isinstance(val, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise DatasetError(f"{where}: field {key!r} must be {names}, got {type(val).__name__}")
    return val


def parse_math500(row: dict, where: str) -> Prompt:
    uid = require_field(row, "unique_id", str, where)
    return Prompt("math500", uid, require_field(row, "problem", str, where), str(require_field(row, "answer", (str, int), where)),
                  extra={"subject": uid.split("/")[1] if uid.count("/") >= 2 else None})


def parse_aime2024(row: dict, where: str) -> Prompt:
    return Prompt("aime2024", require_field(row, "ID", str, where), require_field(row, "Problem", str, where),
                  str(require_field(row, "Answer", (int, str), where)), extra={"year": 2024})


def parse_aime2025(row: dict, where: str) -> Prompt:
    return Prompt("aime2025", require_field(row, "id", str, where), require_field(row, "problem", str, where),
                  str(require_field(row, "answer", (str, int), where)), extra={"year": 2025})


def parse_humaneval(row: dict, where: str) -> Prompt:
    prompt = require_field(row, "prompt", str, where)
    return Prompt("humaneval", require_field(row, "task_id", str, where), prompt,
                  require_field(row, "canonical_solution", str, where),
                  extra={"prompt": prompt, "entry_point": require_field(row, "entry_point", str, where),
                         "test": require_field(row, "test", str, where)})


def parse_mbpp(row: dict, where: str) -> Prompt:
    tid = require_field(row, "task_id", int, where)
    tests = require_field(row, "test_list", list, where)
    return Prompt("mbpp", str(tid), require_field(row, "text", str, where), require_field(row, "code", str, where),
                  extra={"task_id": tid, "test_list": list(tests), "test_setup_code": row.get("test_setup_code") or "",
                         "challenge_test_list": list(row.get("challenge_test_list") or [])})


_FUNC_NAME = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


def parse_lcb(row: dict, where: str, index: int, name: str = "lcb-v5") -> Prompt:
    """One LiveCodeBench row; `name` is "lcb-v5" or "lcb-v6" (the release the file holds)."""
    raw = require_field(row, "public_test_cases", (str, list), where)
    try:
        tests = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as e:
        raise DatasetError(f"{where}: public_test_cases is not valid JSON ({e})") from e
    if not isinstance(tests, list) or not all(isinstance(t, dict) and {"input", "output"} <= set(t) for t in tests):
        raise DatasetError(f"{where}: public_test_cases must be a list of {{input, output, testtype}} objects")
    starter = row.get("starter_code") or ""
    m = _FUNC_NAME.search(starter)
    return Prompt(name, f"{name}-{index}", require_field(row, "question_content", str, where), None,
                  extra={"tests": tests, "starter_code": starter, "func_name": m.group(1) if m else None,
                         "testtype": tests[0].get("testtype") if tests else None,
                         "release": "release_" + name.rsplit("-", 1)[1]})


def parse_mmlu(row: dict, where: str, index: int) -> Prompt:
    choices = require_field(row, "choices", list, where)
    ans = require_field(row, "answer", int, where)
    if not 0 <= ans < len(choices):
        raise DatasetError(f"{where}: answer index {ans} outside the {len(choices)} choices")
    subject = require_field(row, "subject", str, where)
    return Prompt("mmlu", f"mmlu-{index}", require_field(row, "question", str, where), LETTERS[ans],
                  choices=tuple(str(c) for c in choices), extra={"subject": subject, "answer_index": ans})


def parse_gpqa(row: dict, where: str, seed: int) -> Prompt:
    rid = require_field(row, "Record ID", str, where)
    correct = require_field(row, "Correct Answer", str, where).strip()
    options = [correct] + [require_field(row, f"Incorrect Answer {k}", str, where).strip() for k in (1, 2, 3)]
    order = list(range(4))
    digest = hashlib.sha256(f"{seed}:{rid}".encode()).digest()
    random.Random(int.from_bytes(digest[:8], "big")).shuffle(order)
    choices = tuple(options[i] for i in order)
    ans = order.index(0)
    return Prompt("gpqa", rid, require_field(row, "Question", str, where).strip(), LETTERS[ans], choices=choices,
                  extra={"answer_index": ans, "subdomain": row.get("Subdomain"),
                         "domain": row.get("High-level domain"), "shuffle_seed": seed})


def as_aime(p: Prompt) -> Prompt:
    """An AIME 2024 or 2025 prompt relabelled as the combined `aime` dataset."""
    return Prompt("aime", p.id, p.question, p.answer, p.choices, p.extra)
