"""Upstream rows -> `Prompt`s: one public parser per dataset, shared by the offline reader (`loading`) and
the hub reader (`hub`), so a prompt is the same object whichever way it was read.

Each parser takes the row and `where` (file:line or hub:source[i], named in every error).  GPQA's answer
choices are shuffled per question with a `random.Random` seeded from sha256(f"{seed}:{Record ID}"): the
order does not depend on which rows or how many are loaded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import re
import zlib
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
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(val, kinds) or isinstance(val, bool) and bool not in kinds:  # JSON true is not an int
        names = "/".join(k.__name__ for k in kinds)
        raise DatasetError(f"{where}: field {key!r} must be {names}, got {type(val).__name__}")
    if isinstance(val, str) and not val.strip():
        raise DatasetError(f"{where}: field {key!r} is empty")
    return val


def strings(row: dict[str, Any], key: str, where: str, *, required: bool = True) -> list[str]:
    """`row[key]`, a list of strings (absent or null: [] unless `required`); otherwise a `DatasetError`."""
    if not required and row.get(key) is None:
        return []
    val = require_field(row, key, list, where)
    bad = [v for v in val if not isinstance(v, str)]
    if bad:
        raise DatasetError(f"{where}: field {key!r} must hold strings, got {type(bad[0]).__name__}")
    return list(val)


_AIME_ANSWER = re.compile(r"\s*(\d{1,3})\s*(?:\^\s*\{?\s*\\circ\s*\}?)?\s*")
"""An AIME answer: an integer 0-999 (upstream writes 2025-II-5's as "336^\\circ")."""


def aime_answer(row: dict[str, Any], key: str, where: str) -> str:
    """The AIME gold answer as its integer's digits ("042" -> "42"); anything else is a `DatasetError`."""
    val = require_field(row, key, (str, int), where)
    m = _AIME_ANSWER.fullmatch(str(val))
    if m is None:
        raise DatasetError(f"{where}: field {key!r} must be an AIME answer, an integer 0-999, got {val!r}")
    return str(int(m.group(1)))


def parse_math500(row: dict, where: str) -> Prompt:
    uid = require_field(row, "unique_id", str, where)
    return Prompt("math500", uid, require_field(row, "problem", str, where), str(require_field(row, "answer", (str, int), where)),
                  extra={"subject": uid.split("/")[1] if uid.count("/") >= 2 else None})


def parse_aime2024(row: dict, where: str) -> Prompt:
    return Prompt("aime2024", require_field(row, "ID", str, where), require_field(row, "Problem", str, where),
                  aime_answer(row, "Answer", where), extra={"year": 2024})


def parse_aime2025(row: dict, where: str) -> Prompt:
    return Prompt("aime2025", require_field(row, "id", str, where), require_field(row, "problem", str, where),
                  aime_answer(row, "answer", where), extra={"year": 2025})


def parse_humaneval(row: dict, where: str) -> Prompt:
    prompt = require_field(row, "prompt", str, where)
    entry = require_field(row, "entry_point", str, where)
    if not entry.isidentifier():
        raise DatasetError(f"{where}: field 'entry_point' must be a function name, got {entry!r}")
    return Prompt("humaneval", require_field(row, "task_id", str, where), prompt,
                  require_field(row, "canonical_solution", str, where),
                  extra={"prompt": prompt, "entry_point": entry,
                         "test": require_field(row, "test", str, where)})


def parse_mbpp(row: dict, where: str) -> Prompt:
    tid = require_field(row, "task_id", int, where)
    tests = strings(row, "test_list", where)
    if not any(t.strip() for t in tests):  # the grader runs these asserts: with none, any code would pass
        raise DatasetError(f"{where}: field 'test_list' holds no tests")
    setup = row.get("test_setup_code") or ""
    if not isinstance(setup, str):
        raise DatasetError(f"{where}: field 'test_setup_code' must be str, got {type(setup).__name__}")
    return Prompt("mbpp", str(tid), require_field(row, "text", str, where), require_field(row, "code", str, where),
                  extra={"task_id": tid, "test_list": tests, "test_setup_code": setup,
                         "challenge_test_list": strings(row, "challenge_test_list", where, required=False)})


_FUNC_NAME = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


_PICKLE_STRING_OPS = {"BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE"}
_PICKLE_SAFE_OPS = _PICKLE_STRING_OPS | {"PROTO", "FRAME", "MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT", "STOP"}
MAX_TESTS_BYTES = 1 << 30
"""The largest decompressed test payload accepted (a zlib bomb stops here)."""


def pickled_string(data: bytes, where: str) -> str:
    """The one string a pickle holds, read by walking its opcodes (`pickletools.genops` parses, it runs
    nothing); any other opcode (a global, a reduce: code an unpickler would run) is refused."""
    import pickletools

    strings = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name not in _PICKLE_SAFE_OPS:
                raise DatasetError(f"{where}: the pickled tests hold opcode {op.name}, not just a string; refused "
                                   "(never unpickled)")
            if op.name in _PICKLE_STRING_OPS:
                strings.append(arg)
    except (ValueError, IndexError, EOFError, UnicodeDecodeError) as e:
        if isinstance(e, DatasetError):
            raise
        raise DatasetError(f"{where}: the pickled tests are not a valid pickle ({e})") from e
    if len(strings) != 1:
        raise DatasetError(f"{where}: the pickled tests hold {len(strings)} strings, expected 1")
    return strings[0]


def decode_lcb_tests(raw: str | list, where: str, field: str) -> list[dict[str, Any]]:
    """LiveCodeBench tests: a list, JSON text, or (`private_test_cases` of hub rows only) base64 of zlib of a
    pickle of JSON text, as lcb_runner reads them; decoded without unpickling (`pickled_string`)."""
    if isinstance(raw, list):
        tests = raw
    else:
        try:
            tests = json.loads(raw)
        except json.JSONDecodeError as e:
            if field != "private_test_cases":
                raise DatasetError(f"{where}: {field} is not valid JSON ({e})") from e
            try:
                packed = base64.b64decode(raw.encode("ascii"), validate=True)
                unz = zlib.decompressobj()
                data = unz.decompress(packed, MAX_TESTS_BYTES)
            except (ValueError, UnicodeEncodeError, zlib.error) as e:
                raise DatasetError(f"{where}: {field} is not valid JSON nor base64+zlib+pickle ({e})") from e
            if unz.unconsumed_tail:
                raise DatasetError(f"{where}: {field} decompresses past {MAX_TESTS_BYTES} bytes")
            try:
                tests = json.loads(pickled_string(data, where))
            except json.JSONDecodeError as e:
                raise DatasetError(f"{where}: {field} does not hold JSON ({e})") from e
    if not isinstance(tests, list) or not all(isinstance(t, dict) and {"input", "output"} <= set(t) for t in tests):
        raise DatasetError(f"{where}: {field} must be a list of {{input, output, testtype}} objects")
    for i, t in enumerate(tests, 1):
        if not isinstance(t["input"], str) or not isinstance(t["output"], str):
            raise DatasetError(f"{where}: {field} test {i}: input and output must be strings")
        if t.get("testtype", "stdin") not in ("stdin", "functional"):
            raise DatasetError(f"{where}: {field} test {i}: testtype must be stdin or functional, "
                               f"got {t['testtype']!r}")
        if t.get("testtype") == "functional":  # the grader reads each input line and the output as JSON
            try:
                [json.loads(line) for line in t["input"].split("\n") if line.strip()] + [json.loads(t["output"])]
            except json.JSONDecodeError as e:
                raise DatasetError(f"{where}: {field} test {i}: a functional test's input lines and output must be "
                                   f"JSON ({e})") from e
    return tests


def parse_lcb(row: dict, where: str, index: int, name: str = "lcb-v5") -> Prompt:
    """One LiveCodeBench row; `name` is "lcb-v5" or "lcb-v6" (the release the file holds).  `extra["tests"]`
    holds the public tests, `extra["private_tests"]` the private ones when the row carries them (hub rows do;
    the offline copy does not), and the graders run both."""
    tests = decode_lcb_tests(require_field(row, "public_test_cases", (str, list), where), where, "public_test_cases")
    private_raw = row.get("private_test_cases")
    private = decode_lcb_tests(private_raw, where, "private_test_cases") if private_raw else []
    if not tests and not private:  # nothing to grade against: every response would fail as "no tests"
        raise DatasetError(f"{where}: no tests (public_test_cases and private_test_cases are empty)")
    starter = row.get("starter_code") or ""
    m = _FUNC_NAME.search(starter)
    func = m.group(1) if m else None
    meta = row.get("metadata") or {}
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            meta = {}
    if isinstance(meta, dict) and isinstance(meta.get("func_name"), str):
        func = meta["func_name"]
    if func is None and any(t.get("testtype") == "functional" for t in tests + private):
        raise DatasetError(f"{where}: functional tests need a function name (metadata func_name or a def in "
                           "starter_code)")
    return Prompt(name, f"{name}-{index}", require_field(row, "question_content", str, where), None,
                  extra={"tests": tests, "private_tests": private, "starter_code": starter, "func_name": func,
                         "testtype": tests[0].get("testtype") if tests else None,
                         "release": "release_" + name.rsplit("-", 1)[1]})


def parse_mmlu(row: dict, where: str, index: int) -> Prompt:
    choices = strings(row, "choices", where)
    if not 2 <= len(choices) <= len(LETTERS):
        raise DatasetError(f"{where}: field 'choices' must hold 2 to {len(LETTERS)} options, got {len(choices)}")
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
