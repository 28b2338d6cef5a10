"""`forerun eval --resume` (cli/eval_resume.py): the records a resume keeps in the run file - and so in its report -
are checked against the prompts of now even where this run does not load their dataset."""

from __future__ import annotations

import json
from pathlib import Path

from forerun.eval.harness.runs import load_run

SMALL = ["eval", "--model", "tiny", "--methods", "greedy", "--n", "4"]


def _mmlu_rows(path: Path, answers: list[int]) -> None:
    path.write_text("".join(json.dumps({"question": f"Q{i}?", "subject": "s", "choices": ["a", "b", "c", "d"],
                                        "answer": a}) + "\n" for i, a in enumerate(answers)))


def _data_dir(tmp_path: Path, name: str, mmlu_answers: list[int] | None) -> Path:
    """A data folder with the first 3 rows of the shipped MATH500 copy and, unless None, a 3-row MMLU file."""
    from forerun.eval.datasets.loading import resolve_data_dir

    folder = tmp_path / name
    folder.mkdir()
    source = resolve_data_dir(None).path / "math500.jsonl"
    (folder / "math500.jsonl").write_text("".join(source.read_text(encoding="utf-8").splitlines(True)[:3]))
    if mmlu_answers is not None:
        _mmlu_rows(folder / "mmlu_test.jsonl", mmlu_answers)
    return folder


def test_records_of_a_dataset_left_out_of_a_resume_are_checked(tmp_path, run_forerun_in_process,
                                                               assert_one_line_error):
    """A resume with fewer --datasets than the run file holds keeps the other datasets' records (and reports them);
    they were resumed unchecked, so an edited row of such a dataset mixed results for two prompts in one report.
    They are checked as the records of the datasets loaded now are; a dataset that cannot be loaded to check them is
    refused, naming it; the file is left as it was each time."""
    data = _data_dir(tmp_path, "data", [0, 1, 2])
    run = tmp_path / "run.jsonl"
    assert run_forerun_in_process([*SMALL, "--datasets", "math500,mmlu", "--limit", "2", "--data-dir", str(data),
                                   "--out", str(run)]).returncode == 0
    resume = [*SMALL, "--datasets", "math500", "--limit", "3", "--out", str(run), "--resume"]

    _mmlu_rows(data / "mmlu_test.jsonl", [1, 1, 2])  # mmlu's first row edited under the same id (its gold)
    before = run.read_bytes()
    proc = run_forerun_in_process([*resume, "--data-dir", str(data)])
    assert_one_line_error(proc, "another prompt than the one loaded now", code=2)
    assert "mmlu prompt 'mmlu-0'" in proc.stderr and run.read_bytes() == before

    elsewhere = _data_dir(tmp_path, "no_mmlu", None)  # mmlu's records cannot be checked: refused, not kept blind
    proc = run_forerun_in_process([*resume, "--data-dir", str(elsewhere)])
    assert_one_line_error(proc, "holds results for mmlu, which is not among --datasets", code=2)
    assert run.read_bytes() == before

    _mmlu_rows(data / "mmlu_test.jsonl", [0, 1, 2])  # the rows it was run on: the resume goes on
    proc = run_forerun_in_process([*resume, "--data-dir", str(data), "--json"])
    assert proc.returncode == 0, proc.stderr
    assert sorted((r["dataset"], r["prompt_index"]) for r in load_run(run)) == [
        ("math500", 0), ("math500", 1), ("math500", 2), ("mmlu", 0), ("mmlu", 1)]


def test_a_run_file_saved_without_its_last_newline_keeps_its_last_record(tmp_path, run_forerun_in_process):
    """A run file edited by hand and saved without its final newline: `eval report` left the last record out
    without a word, and --resume deleted it as a torn line and ran the item again."""
    run = tmp_path / "run.jsonl"
    argv = [*SMALL, "--datasets", "mmlu", "--limit", "2", "--out", str(run)]
    assert run_forerun_in_process(argv).returncode == 0
    whole = run.read_text()
    run.write_text(whole.removesuffix("\n"))
    proc = run_forerun_in_process(["eval", "report", str(run), "--out", str(tmp_path / "report"), "--json"])
    assert proc.returncode == 0, proc.stderr
    (cell,) = json.loads(proc.stdout)["cells"]
    assert cell["n"] == 2
    proc = run_forerun_in_process([*argv, "--resume", "--json"])
    assert proc.returncode == 0 and json.loads(proc.stdout)["written_now"] == 0, proc.stderr
    assert run.read_text() == whole.removesuffix("\n")  # nothing to run, nothing written or cut
    proc = run_forerun_in_process([*argv[:-4], "--limit", "3", "--out", str(run), "--resume"])
    assert proc.returncode == 0, proc.stderr
    assert run.read_text().startswith(whole) and [r["prompt_index"] for r in load_run(run)] == [0, 1, 2]


def test_records_past_a_smaller_limit_that_the_data_now_lacks_are_refused(tmp_path, run_forerun_in_process,
                                                                         assert_one_line_error):
    """A resume with a smaller --limit keeps the records past it (file and report) and checks them against the rows
    loaded up to the last one they name; data that no longer has those rows (a shorter file) left them unchecked
    while a resume with fewer --datasets refuses the same case: refused too, the file untouched."""
    data = _data_dir(tmp_path, "data", None)
    run = tmp_path / "run.jsonl"
    argv = [*SMALL, "--datasets", "math500", "--out", str(run)]
    assert run_forerun_in_process([*argv, "--limit", "3", "--data-dir", str(data)]).returncode == 0
    short = tmp_path / "short"
    short.mkdir()
    (short / "math500.jsonl").write_text((data / "math500.jsonl").read_text().splitlines(True)[0])
    before = run.read_bytes()
    proc = run_forerun_in_process([*argv, "--limit", "1", "--data-dir", str(short), "--resume"])
    assert_one_line_error(proc, "holds results for math500 prompts up to index 2, but its data now has 1 rows",
                          code=2)
    assert run.read_bytes() == before
    proc = run_forerun_in_process([*argv, "--limit", "1", "--data-dir", str(data), "--resume", "--json"])
    assert proc.returncode == 0, proc.stderr  # the data it was made on: the records past the limit check out
