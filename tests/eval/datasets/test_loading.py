"""Dataset loaders: counts against the offline copies, packaged slices, GPQA shuffle, malformed rows."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import pytest

from forerun.eval.datasets import loading as ds
from forerun.eval.datasets.loading import load_prompts, packaged_data_dir, resolve_data_dir
from forerun.eval.datasets.registry import DATASETS, DatasetError
from forerun.eval.datasets.prompt import Prompt

EXPECTED = {"math500": 500, "humaneval": 164, "mbpp": 500, "mmlu": 14042, "gpqa": 198, "lcb-v5": 279, "aime": 60,
            "aime2024": 30, "aime2025": 30}


def _shared_dir() -> Path:
    src = resolve_data_dir()
    if src.packaged:
        pytest.skip("no shared/datasets folder found near the checkout and FORERUN_DATA_DIR unset: "
                    "the full offline datasets are not available here")
    return src.path


@pytest.fixture(scope="module")
def shared() -> Path:
    return _shared_dir()


@pytest.fixture()
def no_data_dir(monkeypatch):
    """Make resolution fall through to the packaged slices."""
    monkeypatch.delenv(ds.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(ds, "_checkout_data_dir", lambda max_levels=4: None)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_full_counts(shared, name):
    prompts = load_prompts(name, data_dir=shared)
    assert len(prompts) == EXPECTED[name] == DATASETS[name].size
    assert len({p.id for p in prompts}) == len(prompts), "ids must be unique"
    for p in prompts[:50]:
        assert p.question.strip() and p.user_message().strip()
        assert p.dataset == name


def test_aliases_and_unknown(shared):
    assert [p.id for p in load_prompts("lcb", data_dir=shared, limit=3)] == \
           [p.id for p in load_prompts("lcb-v5", data_dir=shared, limit=3)]
    assert load_prompts("LCB", data_dir=shared, limit=1)[0].dataset == "lcb-v5"
    assert len(load_prompts("gpqa-diamond", data_dir=shared, limit=2)) == 2
    with pytest.raises(KeyError, match="unknown dataset 'lcb-v7'"):
        load_prompts("lcb-v7", data_dir=shared)


def _v6_copy(shared: Path, folder: Path, name: str, rows: int = 4) -> Path:
    """A stand-in release_v6 file: the first rows of the v5 copy (the schema is the same)."""
    lines = (shared / "lcb.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:rows]
    path = folder / name
    path.write_text("".join(lines), encoding="utf-8")
    return path


def test_lcb_v6_is_read_from_a_given_file_and_labelled_v6(shared, tmp_path):
    v5 = load_prompts("lcb-v5", data_dir=shared, limit=4)
    v6 = load_prompts("lcb-v6", file=_v6_copy(shared, tmp_path, "release_v6_rows.jsonl"))
    assert [p.dataset for p in v6] == ["lcb-v6"] * 4
    assert [p.id for p in v6] == [f"lcb-v6-{i}" for i in range(4)]
    assert {p.extra["release"] for p in v6} == {"release_v6"} and v5[0].extra["release"] == "release_v5"
    assert [(p.question, p.extra["tests"], p.extra["func_name"]) for p in v6] == \
           [(p.question, p.extra["tests"], p.extra["func_name"]) for p in v5]
    assert all(p.category == "code" for p in v6)
    # the data directory's lcb_v6.jsonl is read the same way; limit applies
    _v6_copy(shared, tmp_path, "lcb_v6.jsonl")
    assert [p.id for p in load_prompts("livecodebench-v6", data_dir=tmp_path, limit=2)] == ["lcb-v6-0", "lcb-v6-1"]


def test_lcb_v6_missing_or_misused_file_errors(shared, tmp_path):
    with pytest.raises(DatasetError, match="lcb_v6.jsonl not found.*not shipped"):
        load_prompts("lcb-v6", data_dir=shared)
    with pytest.raises(DatasetError, match="not found"):
        load_prompts("lcb-v6", file=tmp_path / "absent.jsonl")
    with pytest.raises(DatasetError, match="stored as 2 files"):
        load_prompts("aime", file=tmp_path / "aime.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_content": "q"}\n')
    with pytest.raises(DatasetError, match="bad.jsonl:1"):
        load_prompts("lcb-v6", file=bad)


def test_limit(shared):
    assert len(load_prompts("math500", data_dir=shared, limit=20)) == 20
    assert load_prompts("math500", data_dir=shared, limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        load_prompts("math500", data_dir=shared, limit=-1)


def test_math_fields(shared):
    p = load_prompts("math500", data_dir=shared, limit=1)[0]
    assert p.id == "test/precalculus/807.json" and p.extra["subject"] == "precalculus"
    assert p.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert "\\boxed{}" in p.user_message() and p.question in p.user_message()
    assert p.text == p.question and p.category == "math"
    assert p.messages() == [{"role": "user", "content": p.user_message()}]
    aime = load_prompts("aime", data_dir=shared)
    assert [p.extra["year"] for p in aime] == [2024] * 30 + [2025] * 30
    assert aime[0].id == "2024-II-4" and aime[0].answer == "33"
    assert all(p.dataset == "aime" for p in aime)


def test_code_fields(shared):
    he = load_prompts("humaneval", data_dir=shared, limit=1)[0]
    assert he.id == "HumanEval/0" and he.extra["entry_point"] == "has_close_elements"
    assert "def check" in he.extra["test"] and he.question in he.user_message()
    mbpp = load_prompts("mbpp", data_dir=shared)
    assert [p.extra["task_id"] for p in mbpp] == list(range(11, 511))
    assert mbpp[0].extra["test_list"][0] in mbpp[0].user_message()
    lcb = load_prompts("lcb-v5", data_dir=shared)
    kinds = collections.Counter(t["testtype"] for p in lcb for t in p.extra["tests"])
    assert kinds == {"stdin": 474, "functional": 262}  # the counts the offline README states
    functional = [p for p in lcb if p.extra["starter_code"].strip()]
    assert functional and all(p.extra["func_name"] for p in functional)
    assert functional[0].extra["starter_code"].strip() in functional[0].user_message()
    assert all(p.answer is None for p in lcb)


def test_mmlu_hf_order_and_letters(shared):
    mmlu = load_prompts("mmlu", data_dir=shared)
    subjects = [p.extra["subject"] for p in mmlu]
    assert subjects == sorted(subjects)  # HF "all" order
    assert len(set(subjects)) == 57
    p = mmlu[0]
    assert p.extra["subject"] == "abstract_algebra" and len(p.choices) == 4
    assert p.answer == "ABCD"[p.extra["answer_index"]]
    msg = p.user_message()
    for letter, choice in zip("ABCD", p.choices):
        assert f"{letter}) {choice.strip()}" in msg


def test_gpqa_shuffle_is_fixed_and_per_question(shared):
    a = load_prompts("gpqa", data_dir=shared)
    b = load_prompts("gpqa", data_dir=shared)
    assert [p.choices for p in a] == [p.choices for p in b]
    # independent of how many rows are loaded
    assert [p.choices for p in load_prompts("gpqa", data_dir=shared, limit=5)] == [p.choices for p in a[:5]]
    import csv

    with open(shared / "gpqa_diamond.csv", encoding="utf-8", newline="") as fh:
        rows = {r["Record ID"]: r for r in csv.DictReader(fh)}
    for p in a:
        row = rows[p.id]
        assert p.choices[p.extra["answer_index"]] == row["Correct Answer"].strip()
        assert p.answer == "ABCD"[p.extra["answer_index"]]
        assert sorted(p.choices) == sorted(row[k].strip() for k in
                                           ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                                            "Incorrect Answer 3"))
    positions = collections.Counter(p.extra["answer_index"] for p in a)
    assert len(positions) == 4 and min(positions.values()) > 25  # actually shuffled, not always "A"
    other = load_prompts("gpqa", data_dir=shared, gpqa_seed=1)
    assert [p.choices for p in other] != [p.choices for p in a]


def test_packaged_slices_match_the_full_data(shared, no_data_dir):
    assert resolve_data_dir().packaged
    for name in ("math500", "humaneval", "mbpp", "mmlu", "aime2024", "aime2025", "aime"):
        packaged = load_prompts(name, limit=20)
        full = load_prompts(name, data_dir=shared, limit=20)
        assert packaged == full, name


def test_packaged_slices_alone(no_data_dir):
    for name in ("math500", "humaneval", "mbpp", "mmlu", "aime2024", "aime2025", "aime"):
        with pytest.warns(UserWarning, match="packaged"):
            prompts = load_prompts(name)
        assert len(prompts) == 20
    with pytest.raises(DatasetError, match="FORERUN_DATA_DIR"):
        load_prompts("math500", limit=21)
    for name in ("gpqa", "lcb"):
        with pytest.raises(DatasetError, match="not packaged"):
            load_prompts(name, limit=1)


def test_no_gpqa_or_lcb_rows_in_the_repo():
    data = packaged_data_dir()
    names = {p.name for p in data.iterdir()}
    assert names == {"PROVENANCE.md", "math500.jsonl", "humaneval.jsonl", "mbpp.jsonl", "mmlu.jsonl",
                     "aime2024.jsonl", "aime2025.jsonl"}
    # no packaged line contains a GPQA question (checked against the data dir when it is there)
    src = resolve_data_dir()
    if not src.packaged and (src.path / "gpqa_diamond.csv").is_file():
        import csv

        with open(src.path / "gpqa_diamond.csv", encoding="utf-8", newline="") as fh:
            questions = [r["Question"].strip()[:80] for r in csv.DictReader(fh)]
        blob = "".join((data / n).read_text(encoding="utf-8") for n in names)
        assert not any(q and json.dumps(q)[1:-1] in blob for q in questions)


def test_resolution_order(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    monkeypatch.setenv(ds.DATA_DIR_ENV, str(b))
    assert resolve_data_dir(a).path == a and resolve_data_dir(a).origin == "argument"
    assert resolve_data_dir().path == b and resolve_data_dir().origin == "env"
    monkeypatch.setenv(ds.DATA_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(DatasetError, match=ds.DATA_DIR_ENV):
        resolve_data_dir()
    with pytest.raises(DatasetError, match="not a directory"):
        resolve_data_dir(tmp_path / "nope")
    monkeypatch.delenv(ds.DATA_DIR_ENV)
    found = resolve_data_dir()
    assert found.origin in ("checkout", "packaged")
    with pytest.raises(DatasetError, match="math500.jsonl"):
        load_prompts("math500", data_dir=a)


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_malformed_rows_name_file_and_line(tmp_path):
    good = json.dumps({"problem": "1+1?", "answer": "2", "unique_id": "test/algebra/1.json"})
    _write(tmp_path / "math500.jsonl", [good, good.replace("1.json", "2.json"), "{not json"])
    with pytest.raises(DatasetError, match=r"math500\.jsonl:3: bad JSON"):
        load_prompts("math500", data_dir=tmp_path)
    _write(tmp_path / "math500.jsonl", [good, json.dumps({"problem": "x", "unique_id": "u"})])
    with pytest.raises(DatasetError, match=r"math500\.jsonl:2: missing field 'answer'"):
        load_prompts("math500", data_dir=tmp_path)
    _write(tmp_path / "math500.jsonl", [json.dumps(["a", "list"])])
    with pytest.raises(DatasetError, match=r"math500\.jsonl:1: expected a JSON object"):
        load_prompts("math500", data_dir=tmp_path)
    _write(tmp_path / "mmlu_test.jsonl", [json.dumps({"question": "q", "subject": "s", "choices": ["a", "b"],
                                                       "answer": 5})])
    with pytest.raises(DatasetError, match=r"mmlu_test\.jsonl:1: answer index 5"):
        load_prompts("mmlu", data_dir=tmp_path)
    _write(tmp_path / "lcb.jsonl", [json.dumps({"question_content": "q", "starter_code": "",
                                                 "public_test_cases": "[{oops"})])
    with pytest.raises(DatasetError, match=r"lcb\.jsonl:1: public_test_cases is not valid JSON"):
        load_prompts("lcb", data_dir=tmp_path)
    (tmp_path / "gpqa_diamond.csv").write_text("Question,Correct Answer\nq,a,extra\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"gpqa_diamond\.csv:2"):
        load_prompts("gpqa", data_dir=tmp_path)


def test_hub_needs_datasets_package(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real(name, *a))
    with pytest.raises(DatasetError, match="datasets"):
        load_prompts("math500", hub=True)


def test_prompt_is_hashable_and_chat_prompt():
    p = Prompt("math500", "x", "What is 1+1?", "2", extra={"subject": "algebra"})
    hash(p)

    class Tok:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return "<user>" + messages[0]["content"] + "<assistant>"

    assert p.chat_prompt(Tok()).startswith("<user>What is 1+1?")


@pytest.mark.parametrize("name, fname", [("math500", "math500.jsonl"), ("humaneval", "humaneval.jsonl")])
def test_an_empty_dataset_file_is_refused_not_a_zero_item_run(tmp_path, name, fname):
    """An empty copy used to load as 0 prompts: `sample` said "valid: 0 to -1" and `eval` wrote a 0-item run."""
    (tmp_path / fname).write_text("")
    with pytest.raises(DatasetError, match="holds no prompts"):
        load_prompts(name, data_dir=tmp_path)


def test_a_repeated_prompt_id_is_refused_naming_both_lines(tmp_path):
    """Items are keyed by (dataset, method, prompt id, seed): two rows with one id ran twice and the report kept
    only the last line, silently dropping the other row's result."""
    rows = [{"problem": "1+1?", "answer": "2", "unique_id": "test/algebra/1.json"},
            {"problem": "2+2?", "answer": "4", "unique_id": "test/algebra/2.json"},
            {"problem": "3+3?", "answer": "6", "unique_id": "test/algebra/1.json"}]
    _write(tmp_path / "math500.jsonl", [json.dumps(r) for r in rows])
    with pytest.raises(DatasetError, match=r"math500\.jsonl:3: prompt id 'test/algebra/1\.json' repeats the one "
                                           r"at .*math500\.jsonl:1"):
        load_prompts("math500", data_dir=tmp_path)
    a24 = {"ID": "2024-I-1", "Problem": "p", "Answer": 1}
    _write(tmp_path / "aime2024.jsonl", [json.dumps(a24)])
    _write(tmp_path / "aime2025.jsonl", [json.dumps({"id": "2024-I-1", "problem": "q", "answer": "2"})])
    with pytest.raises(DatasetError, match=r"aime2025\.jsonl:1: prompt id '2024-I-1' repeats .*aime2024\.jsonl:1"):
        load_prompts("aime", data_dir=tmp_path)


def _refused(tmp_path: Path, name: str, fname: str, row: dict, match: str) -> None:
    _write(tmp_path / fname, [json.dumps(row)])
    with pytest.raises(DatasetError, match=re.escape(f"{fname}:1: ") + match):
        load_prompts(name, data_dir=tmp_path)


MBPP_ROW = {"task_id": 11, "text": "Add.", "code": "def add(a, b): return a + b",
            "test_list": ["assert add(1, 2) == 3"]}
MMLU_ROW = {"question": "q", "subject": "s", "choices": ["a", "b", "c", "d"], "answer": 1}
LCB_TEST = {"input": "[1]\n[2]", "output": "3", "testtype": "functional"}
LCB_ROW = {"question_content": "Add.", "starter_code": "class Solution:\n    def add(self, a, b):\n",
           "public_test_cases": json.dumps([LCB_TEST])}


@pytest.mark.parametrize("name, fname, row, match", [
    # each used to load and then crash the run with a traceback (TypeError, IndexError, AttributeError; LCB: a
    # ValueError at grading, after the generation) or to run an item against a wrong gold / option text
    ("mbpp", "mbpp.jsonl", dict(MBPP_ROW, test_list=[1, 2]), "field 'test_list' must hold strings, got int"),
    ("mbpp", "mbpp.jsonl", dict(MBPP_ROW, test_setup_code=5), "field 'test_setup_code' must be str"),
    ("mmlu", "mmlu_test.jsonl", dict(MMLU_ROW, choices=[str(i) for i in range(12)], answer=11),
     "field 'choices' must hold 2 to 10 options, got 12"),
    ("mmlu", "mmlu_test.jsonl", dict(MMLU_ROW, choices=["a", None, "c", "d"]), "field 'choices' must hold strings"),
    ("mmlu", "mmlu_test.jsonl", dict(MMLU_ROW, answer=True), "field 'answer' must be int, got bool"),
    ("math500", "math500.jsonl", {"problem": "1+1?", "answer": " ", "unique_id": "u"}, "field 'answer' is empty"),
    ("aime2024", "aime2024.jsonl", {"ID": "2024-I-1", "Problem": "p", "Answer": True}, "field 'Answer' must be"),
    ("aime2024", "aime2024.jsonl", {"ID": "2024-I-1", "Problem": "p", "Answer": "twelve"},
     "field 'Answer' must be an AIME answer"),
    ("aime2025", "aime2025.jsonl", {"id": "2025-I-1", "problem": "p", "answer": 1000},
     "field 'answer' must be an AIME"),
    ("humaneval", "humaneval.jsonl", {"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": " 1",
                                      "test": "def check(c): pass", "entry_point": "f()"}, "field 'entry_point'"),
    ("lcb", "lcb.jsonl", dict(LCB_ROW, starter_code=""), "functional tests need a function name"),
    ("lcb", "lcb.jsonl", dict(LCB_ROW, public_test_cases=json.dumps([dict(LCB_TEST, input="[1")])),
     "public_test_cases test 1: a functional test's input lines and output must be JSON"),
    ("lcb", "lcb.jsonl", dict(LCB_ROW, public_test_cases=json.dumps([dict(LCB_TEST, output=3)])),
     "public_test_cases test 1: input and output must be strings"),
    # a code row with no tests: MBPP's empty test_list let any code pass (no assert ran); LCB's graded every
    # response as failed ("no tests")
    ("mbpp", "mbpp.jsonl", dict(MBPP_ROW, test_list=[]), "field 'test_list' holds no tests"),
    ("mbpp", "mbpp.jsonl", dict(MBPP_ROW, test_list=["", " "]), "field 'test_list' holds no tests"),
    ("lcb", "lcb.jsonl", dict(LCB_ROW, public_test_cases="[]"), "no tests"),
])
def test_a_malformed_field_is_refused_naming_file_and_line(tmp_path, name, fname, row, match):
    _refused(tmp_path, name, fname, row, match)


def test_aime_gold_answers_are_integers():
    """AIME is graded as integers: upstream's "336^\\circ" (2025-II-5) and "042" become their integer's digits."""
    from forerun.eval.datasets.parsers import parse_aime2024, parse_aime2025

    assert parse_aime2025({"id": "2025-II-5", "problem": "p", "answer": "336^\\circ"}, "f:1").answer == "336"
    assert parse_aime2024({"ID": "2024-I-1", "Problem": "p", "Answer": "042"}, "f:1").answer == "42"
    assert parse_aime2024({"ID": "2024-I-1", "Problem": "p", "Answer": 7}, "f:1").answer == "7"


def test_an_aime_year_read_from_a_file_of_any_name_uses_that_years_schema(tmp_path):
    """`--dataset-file aime2024=PATH` picked the parser by the file's name: any name not starting "aime2024" was
    read in AIME 2025's schema and refused ("missing field 'id'")."""
    _write(tmp_path / "mine.jsonl", [json.dumps({"ID": "2024-I-1", "Problem": "p", "Answer": 33})])
    (p,) = load_prompts("aime2024", file=tmp_path / "mine.jsonl")
    assert (p.id, p.answer, p.extra["year"]) == ("2024-I-1", "33", 2024)
    _write(tmp_path / "aime2024_copy.jsonl", [json.dumps({"id": "2025-I-1", "problem": "q", "answer": "7"})])
    (p,) = load_prompts("aime2025", file=tmp_path / "aime2024_copy.jsonl")
    assert (p.id, p.answer, p.extra["year"]) == ("2025-I-1", "7", 2025)


def test_an_mbpp_row_without_tests_would_pass_any_code():
    """Why an MBPP row with an empty test_list is refused: graded, it passes code that solves nothing."""
    from forerun.eval.graders.code import grade_code

    passed, *_ = grade_code("```python\ndef add(a, b):\n    return 0\n```", "mbpp",
                            {"task_id": 11, "test_list": [], "test_setup_code": "", "challenge_test_list": []})
    assert passed


def test_a_byte_order_mark_at_the_start_of_a_file_is_read_as_utf8(tmp_path):
    """A file saved as "UTF-8 with BOM": the JSONL reader refused line 1 ("bad JSON (Unexpected UTF-8 BOM)"), and
    the CSV reader read the BOM into the first column's name, so a GPQA file whose first column is Record ID was
    refused with "missing field 'Record ID'" on a row that has it."""
    bom = b"\xef\xbb\xbf"
    row = {"problem": "1+1?", "answer": "2", "unique_id": "test/algebra/1.json"}
    tmp = tmp_path
    tmp.joinpath("math500.jsonl").write_bytes(bom + json.dumps(row).encode() + b"\r\n")
    (p,) = load_prompts("math500", data_dir=tmp)
    assert (p.id, p.question, p.answer) == ("test/algebra/1.json", "1+1?", "2")
    header = "Record ID,Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3\r\n"
    tmp.joinpath("gpqa_diamond.csv").write_bytes(bom + (header + "rec1,Which?,right,w1,w2,w3\r\n").encode())
    (g,) = load_prompts("gpqa", data_dir=tmp)
    assert g.id == "rec1" and g.choices[g.extra["answer_index"]] == "right"
    assert sorted(g.choices) == ["right", "w1", "w2", "w3"]


def test_a_csv_record_over_many_lines_is_named_by_its_first_line(tmp_path):
    """GPQA's records run over many lines (quoted fields with newlines: every record of the offline copy, up to
    ~290 lines): an error named the record's last line, so "file:N" pointed past the row at fault."""
    header = "Record ID,Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3"
    good = 'rec1,"Which\nof these\nholds?",a,b,c,d'  # lines 2-4
    path = tmp_path / "gpqa_diamond.csv"
    for bad, match in [('rec2,"Two\nlines",,b,c,d', "field 'Correct Answer' is empty"),
                       ('rec1,"Again\nthe same id",a,b,c,d', "prompt id 'rec1' repeats the one at .*csv:2$"),
                       ('rec3,"Short\nrow",a,b,c', "row has 5 fields, the header 6")]:
        text = "\n".join([header, good, "", bad, ""])  # a blank line between the records, one at the end
        first_line_of_bad = text.split("\n").index(bad.split("\n")[0]) + 1  # 6: counted here, not by csv
        path.write_text(text, encoding="utf-8")
        with pytest.raises(DatasetError, match=re.escape(f"gpqa_diamond.csv:{first_line_of_bad}: ") + match):
            load_prompts("gpqa", data_dir=tmp_path)
    path.write_text("\n".join([header, good, "", 'rec2,"x\ny",a,b,c,d', ""]), encoding="utf-8")
    assert [p.id for p in load_prompts("gpqa", data_dir=tmp_path)] == ["rec1", "rec2"]


def test_crlf_non_ascii_and_trailing_blank_lines_parse_as_written(tmp_path):
    """Odd but valid files: CRLF line ends, raw (unescaped) UTF-8 text, blank lines at the end.  A CSV saved with
    CRLF line ends (a Windows copy of gpqa_diamond.csv) gives the prompts of the LF file: the CRLF inside a quoted
    multi-line field is the file's line end, not text (it reached the question as "\r\n", so the chat and the
    prompt fingerprints differed from the original's and `eval --resume` refused the same questions)."""
    row = {"ID": "2024-I-1", "Problem": "Soit $x \u2208 \u211d$, caf\u00e9 \u2014 \u65e5\u672c", "Answer": "033"}
    (tmp_path / "aime2024.jsonl").write_bytes(json.dumps(row, ensure_ascii=False).encode() + b"\r\n\r\n  \r\n")
    (p,) = load_prompts("aime2024", data_dir=tmp_path)
    assert (p.id, p.question, p.answer) == ("2024-I-1", row["Problem"], "33")
    lines = ["Record ID,Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3",
             'rec\u00e9,"Wh\u00e9re?', 'Second line",\u00b5m,nm,pm,fm', "", ""]
    (tmp_path / "lf").mkdir()
    (tmp_path / "lf" / "gpqa_diamond.csv").write_bytes("\n".join(lines).encode())
    (tmp_path / "gpqa_diamond.csv").write_bytes("\r\n".join(lines).encode())
    (g,) = load_prompts("gpqa", data_dir=tmp_path)
    assert g.id == "rec\u00e9" and g.question == "Wh\u00e9re?\nSecond line"
    assert g.choices[g.extra["answer_index"]] == "\u00b5m"
    assert load_prompts("gpqa", data_dir=tmp_path / "lf") == [g]


@pytest.mark.parametrize("bad_line", [1, 3, 400])  # 400: past the text reader's first read-ahead chunk
def test_a_file_that_is_not_utf8_is_a_dataset_error_naming_the_file_offset_and_line(tmp_path, bad_line):
    """load_prompts called from Python raised a bare UnicodeDecodeError ("'utf-8' codec can't decode byte 0xff in
    position 8191"): neither the file nor where in it (the position is in the reader's chunk, not the file); only
    the command line named the file.  Now a DatasetError (a ValueError) names the file, the offset and the line."""
    rows = [json.dumps({"problem": f"{i}+1?", "answer": str(i + 1), "unique_id": f"test/algebra/{i}.json"}).encode()
            for i in range(500)]
    rows[bad_line - 1] = rows[bad_line - 1].replace(b"+1?", b"+1\xff?")
    data = b"\n".join(rows) + b"\n"
    tmp_path.joinpath("math500.jsonl").write_bytes(data)
    offset = data.index(b"\xff")
    assert data[:offset].count(b"\n") == bad_line - 1
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'math500.jsonl'}: not UTF-8 text (byte 0xff at "
                                                   f"offset {offset}, line {bad_line})")) as info:
        load_prompts("math500", data_dir=tmp_path)
    assert isinstance(info.value, DatasetError)
    header = b"Record ID,Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3\n"
    csv_data = header + b"rec1,Which?,right,w1,w2,w3\nrec2,Wh\xe9ch?,right,w1,w2,w3\n"  # latin-1, not UTF-8
    tmp_path.joinpath("gpqa_diamond.csv").write_bytes(csv_data)
    csv_offset = len(header) + len(b"rec1,Which?,right,w1,w2,w3\nrec2,Wh")
    with pytest.raises(DatasetError, match=re.escape(f"{tmp_path / 'gpqa_diamond.csv'}: not UTF-8 text (byte 0xe9 "
                                                     f"at offset {csv_offset}, line 3)")):
        load_prompts("gpqa", data_dir=tmp_path)
    with pytest.raises(DatasetError, match=re.escape(f"offset {offset}, line {bad_line})")):
        load_prompts("math500", file=tmp_path / "math500.jsonl")
