"""`forerun eval` and GPQA's answer-choice shuffle: the seed (`--gpqa-shuffle-seed`) decides the option order the
model is shown, is recorded in the run header and on every GPQA line, and `--resume` with another seed is refused
(one line naming the setting, the file unchanged, no model loaded); a header from before the seed was recorded
resumes with the seed forerun always used then (10086).  The report shows the seed.

The GPQA rows here are invented (never real GPQA rows: its authors ask that they not be published); the
expected option order is recomputed here from the documented rule (sha256(f"{seed}:{Record ID}") seeds a
`random.Random` that shuffles [correct, wrong 1, wrong 2, wrong 3]), not read from the loader."""

from __future__ import annotations

import csv
import hashlib
import json
import random
import re

import pytest

from forerun.cli.main import main
from forerun.eval.harness.runs import read_run

COLUMNS = ("Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
           "Incorrect Answer 3", "Subdomain", "High-level domain")
IDS = ("recSynthA", "recSynthB", "recSynthC")


@pytest.fixture
def fake_gpqa(tmp_path):
    path = tmp_path / "fake_gpqa.csv"
    with open(path, "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for i, rid in enumerate(IDS):
            w.writerow([rid, f"Synthetic question {i}: which label is right?", f"right-{i}", f"wrong1-{i}",
                        f"wrong2-{i}", f"wrong3-{i}", "Synthetic", "Synthetic"])
    return path


def expected_options(rid: str, i: int, seed: int) -> list[str]:
    options = [f"right-{i}", f"wrong1-{i}", f"wrong2-{i}", f"wrong3-{i}"]
    order = list(range(4))
    random.Random(int.from_bytes(hashlib.sha256(f"{seed}:{rid}".encode()).digest()[:8], "big")).shuffle(order)
    return [options[k] for k in order]


def shown_options(monkeypatch) -> dict[str, list[str]]:
    """Spy on the messages each prompt is encoded from: question number -> the options in the order shown."""
    import forerun.eval.harness.items as items

    real, seen = items.chat_prompt_ids, {}

    def spy(tok, messages, **kw):
        text = messages[-1]["content"]
        i = int(re.search(r"Synthetic question (\d+)", text).group(1))
        seen[i] = re.findall(r"^[A-D]\) (\S+)$", text, re.M)
        return real(tok, messages, **kw)

    monkeypatch.setattr(items, "chat_prompt_ids", spy)
    return seen


def args(fake_gpqa, run, *extra):
    return ["eval", "--model", "tiny", "--datasets", "gpqa", "--dataset-file", f"gpqa={fake_gpqa}",
            "--methods", "greedy", "--limit", "3", "--n", "2", "--out", str(run), *extra]


def test_the_seed_decides_the_options_shown_is_recorded_and_a_resume_with_another_is_refused(
        fake_gpqa, tmp_path, capsys, monkeypatch):
    assert any(expected_options(r, i, 7) != expected_options(r, i, 10086) for i, r in enumerate(IDS))  # teeth
    seen = shown_options(monkeypatch)
    run = tmp_path / "run.jsonl"
    assert main(args(fake_gpqa, run, "--gpqa-shuffle-seed", "7")) == 0
    assert seen == {i: expected_options(r, i, 7) for i, r in enumerate(IDS)}
    header, recs = read_run(run)
    assert header["settings"]["gpqa_shuffle_seed"] == 7
    assert [r["gpqa_shuffle_seed"] for r in recs] == [7, 7, 7]
    before = run.read_bytes()
    capsys.readouterr()
    import forerun.cli.evaluate as evaluate

    def no_model(*_a, **_k):
        raise AssertionError("a refused resume must not load a model")

    with monkeypatch.context() as m:
        m.setattr(evaluate, "open_pool_from", no_model)
        assert main(args(fake_gpqa, run, "--resume")) == 2  # the default seed is another setting
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gpqa_shuffle_seed (7 -> 10086)" in err and "Traceback" not in err
    assert run.read_bytes() == before
    assert main(args(fake_gpqa, run, "--resume", "--gpqa-shuffle-seed", "7")) == 0
    assert run.read_bytes() == before  # nothing left to run
    capsys.readouterr()
    assert main(["eval", "report", str(run), "--out", str(tmp_path / "rep")]) == 0
    assert "- GPQA answer-choice shuffle seed: 7\n" in (tmp_path / "rep" / "report.md").read_text()


def test_a_header_from_before_the_seed_was_recorded_resumes_with_10086_only(fake_gpqa, tmp_path, capsys):
    run = tmp_path / "run.jsonl"
    assert main(args(fake_gpqa, run, "--limit", "2")) == 0
    lines = run.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    assert header["settings"]["gpqa_shuffle_seed"] == 10086
    del header["settings"]["gpqa_shuffle_seed"]  # what an older forerun wrote
    records = [json.loads(line) for line in lines[1:]]
    for r in records:
        del r["gpqa_shuffle_seed"]
    run.write_text("".join(json.dumps(x) + "\n" for x in [header, *records]))
    before = run.read_bytes()
    capsys.readouterr()
    assert main(args(fake_gpqa, run, "--resume", "--gpqa-shuffle-seed", "3")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gpqa_shuffle_seed (10086 -> 3)" in err
    assert run.read_bytes() == before
    assert main(args(fake_gpqa, run, "--resume")) == 0  # the old default: resumes, runs the third prompt
    _, recs = read_run(run)
    assert [r["prompt_id"] for r in recs] == list(IDS) and recs[-1]["gpqa_shuffle_seed"] == 10086
    capsys.readouterr()
    assert main(["eval", "report", str(run), "--out", str(tmp_path / "rep")]) == 0
    line = next(x for x in (tmp_path / "rep" / "report.md").read_text().splitlines() if "shuffle seed" in x)
    assert line.startswith("- GPQA answer-choice shuffle seed: 10086, not recorded (older lines")


def test_the_seed_without_gpqa_is_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "run.jsonl"
    assert main(["eval", "--model", "tiny", "--datasets", "mmlu", "--methods", "greedy", "--limit", "1",
                 "--n", "2", "--out", str(run), "--gpqa-shuffle-seed", "7"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gpqa-shuffle-seed" in err and "gpqa" in err
    assert not run.exists()
