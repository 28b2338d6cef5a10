"""`forerun eval`: a failed generation is retried, what still fails is an error line counted as a wrong answer
and the run exits 1; --resume retries it; --resume refuses a run file made with other settings (one line naming
the keys, the file unchanged) and any file that is not a run; --samples gives pass@k and maj@k per cell."""

from __future__ import annotations

import json

import pytest

from forerun.cli.main import main
from forerun.eval.harness import methods
from forerun.eval.harness.runs import final_records, read_run
from forerun.runtime_ext.protocol import EngineError

SMALL = ["eval", "--model", "tiny", "--datasets", "mmlu", "--methods", "greedy,low-temp", "--limit", "2", "--n", "4"]


def test_resume_refuses_other_settings_naming_them_and_leaves_the_file(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run.jsonl"
    assert main([*SMALL, "--out", str(run)]) == 0
    before = run.read_bytes()
    capsys.readouterr()
    import forerun.cli.evaluate as evaluate

    def no_model(*_a, **_k):
        raise AssertionError("a refused resume must not load a model")

    monkeypatch.setattr(evaluate, "open_pool_from", no_model)
    assert main([*SMALL, "--out", str(run), "--resume", "--alpha", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "alpha (4.0 -> 2.0)" in err and "Traceback" not in err
    assert run.read_bytes() == before


def test_resume_refuses_a_file_that_is_not_a_run_untouched(tmp_path, capsys):
    notes = tmp_path / "notes.jsonl"
    notes.write_bytes(b"my notes\nthe last line has no newline")
    assert main([*SMALL, "--out", str(notes), "--resume"]) == 2
    assert "not a forerun run file" in capsys.readouterr().err
    assert notes.read_bytes() == b"my notes\nthe last line has no newline"


def test_errors_are_retried_counted_and_resumed(tmp_path, capsys, monkeypatch):
    real = methods.MethodRunner.run
    calls = {"n": 0}

    def flaky(self, method, *a, **k):  # low-temp always fails this run; greedy fails once, then works
        calls["n"] += 1
        if method == "low-temp" or calls["n"] == 1:
            raise EngineError("server went away")
        return real(self, method, *a, **k)

    monkeypatch.setattr(methods.MethodRunner, "run", flaky)
    monkeypatch.setattr("forerun.eval.harness.items.time.sleep", lambda s: None)
    run = tmp_path / "run.jsonl"
    assert main([*SMALL, "--out", str(run), "--json"]) == 1  # errors remain
    out = json.loads(capsys.readouterr().out)
    cells = {c["method"]: c for c in out["cells"]}
    assert cells["low-temp"]["errors"] == 2 and cells["low-temp"]["n"] == 2 and cells["low-temp"]["correct"] == 0
    assert cells["greedy"]["errors"] == 0  # its first failure was retried
    _, recs = read_run(run)
    assert [r["attempts"] for r in recs if r["method"] == "low-temp"] == [3, 3]

    monkeypatch.setattr(methods.MethodRunner, "run", real)
    assert main([*SMALL, "--out", str(run), "--resume", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["written_now"] == 2 and all(c["errors"] == 0 for c in out["cells"])
    assert len(final_records(read_run(run)[1])) == 4


def test_a_grader_that_fails_is_that_items_error_line_not_the_runs_end(tmp_path, capsys, monkeypatch):
    """A grader raising on one response (a bug, a pathological text) used to end the whole eval with a traceback,
    losing the items in flight: it is that item's error line (response kept), the other items are graded, the run
    exits 1, and --resume retries it."""
    from forerun.eval.harness import items

    real = items.grade

    def fragile(prompt, text):
        if prompt.id == first:
            raise RecursionError("maximum recursion depth exceeded")
        return real(prompt, text)

    run = tmp_path / "run.jsonl"
    small = [*SMALL[:6], "greedy", *SMALL[7:]]
    assert main([*small, "--out", str(tmp_path / "ok.jsonl")]) == 0
    first = read_run(tmp_path / "ok.jsonl")[1][0]["prompt_id"]
    capsys.readouterr()
    monkeypatch.setattr(items, "grade", fragile)
    assert main([*small, "--out", str(run)]) == 1
    assert "Traceback" not in capsys.readouterr().err
    recs = {r["prompt_id"]: r for r in read_run(run)[1]}
    bad = recs[first]
    assert bad["error"] == "grading failed: RecursionError: maximum recursion depth exceeded"
    assert bad["correct"] is False and bad["grade"] is None and isinstance(bad["response"], str)
    assert all("error" not in r and r["grade"] is not None for pid, r in recs.items() if pid != first)
    monkeypatch.setattr(items, "grade", real)
    assert main([*small, "--out", str(run), "--resume"]) == 0
    assert all("error" not in r for r in final_records(read_run(run)[1]))


def test_samples_give_pass_at_k_and_maj_at_k(tmp_path, capsys):
    run = tmp_path / "run.jsonl"
    assert main([*SMALL, "--methods", "low-temp", "--samples", "3", "--out", str(run), "--json"]) == 0
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert cell["n"] == 6 and set(cell["pass_at_k"]) == {"1", "2", "3"} and set(cell["maj_at_k"]) == {"3"}
    assert cell["pass_at_k"]["1"] <= cell["pass_at_k"]["2"] <= cell["pass_at_k"]["3"]
    assert cell["tokens_decoded"] > 0
    with pytest.raises(SystemExit):
        main([*SMALL, "--samples", "0", "--out", str(tmp_path / "x.jsonl")])


def test_graded_text_stops_at_the_first_eos_and_the_header_records_the_horizon(tmp_path, capsys):
    from forerun.eval.harness.eos import cut_at_eos

    assert cut_at_eos([5, 7, 2, 9, 2], (2,)) == [5, 7, 2] and cut_at_eos([5, 7], (2,)) == [5, 7]
    run = tmp_path / "run.jsonl"
    argv = [*SMALL[:-4], "--methods", "power-mh", "--limit", "1", "--n", "6", "--K", "2", "--out", str(run)]
    assert main([*argv, "--fixed-horizon"]) == 0
    header, (rec,) = read_run(run)
    assert header["settings"]["fixed_horizon"] is True and rec["settings"]["horizon"] == "fixed"
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 2  # the horizon is a setting of the run
    assert "fixed_horizon (True -> False)" in capsys.readouterr().err


def test_n_per_dataset_and_prompt_options_reach_the_items(tmp_path, capsys):
    run = tmp_path / "run.jsonl"
    argv = ["eval", "--model", "tiny", "--datasets", "mmlu,math500", "--methods", "greedy", "--limit", "1",
            "--n", "3,math500=5", "--system", "Answer briefly.", "--no-chat-template", "--out", str(run)]
    assert main(argv) == 0
    header, recs = read_run(run)
    assert {r["dataset"]: r["settings"]["max_new_tokens"] for r in recs} == {"mmlu": 3, "math500": 5}
    assert header["settings"]["system"] == "Answer briefly." and header["settings"]["chat_template"] is False
    capsys.readouterr()
    assert main([*argv[:-2], "--thinking", "on", "--out", str(tmp_path / "t.jsonl")]) == 2
    assert "thinking switch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv[:9], "--n", "math500=0", "--out", str(tmp_path / "z.jsonl")])


def test_smc_final_is_recorded_printed_and_kept_by_resume(tmp_path, capsys):
    from forerun.programs.selection_rules import FINAL_RULES, SELECT_RULES

    run = tmp_path / "run.jsonl"
    args = ["eval", "--model", "tiny", "--datasets", "mmlu", "--methods", "best-of-n,power-smc", "--limit", "1",
            "--n", "4", "--smc-block", "2", "--best-of-select", "logp0", "--out", str(run)]
    assert main([*args, "--smc-final", "max-logp0"]) == 0
    out = capsys.readouterr().out
    assert f"power-smc selects by max-logp0: {FINAL_RULES['max-logp0']}" in out
    assert f"best-of-n selects by logp0: {SELECT_RULES['logp0']}" in out
    header, recs = read_run(run)
    assert header["settings"]["smc_final"] == "max-logp0" and "max-logp0" in header["selection_rules"]["power-smc"]
    assert [r["settings"]["final"] for r in recs if r["method"] == "power-smc"] == ["max-logp0"]
    assert [r["extra"]["final"] for r in recs if r["method"] == "power-smc"] == ["max-logp0"]  # what ran
    before = run.read_bytes()
    assert main([*args, "--resume"]) == 2  # the default rule is another setting
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "smc_final ('max-logp0' -> 'sample')" in err
    assert run.read_bytes() == before
    assert main([*args, "--smc-final", "max-logp0", "--resume"]) == 0


def test_a_run_file_from_before_smc_final_resumes_with_the_default(tmp_path, capsys):
    run = tmp_path / "run.jsonl"
    assert main([*SMALL, "--out", str(run)]) == 0
    lines = run.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    del header["settings"]["smc_final"]  # what an older forerun wrote
    run.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    capsys.readouterr()
    assert main([*SMALL, "--out", str(run), "--resume"]) == 0
    assert main([*SMALL, "--out", str(run), "--resume", "--smc-final", "max"]) == 2  # no power-smc here
    assert "--smc-*" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--smc-final", "argmax"], ["--best-of-select", "logp"]])
def test_an_unknown_rule_is_one_line_and_exit_2(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as exc:  # argparse's own exit (cli.main: one line)
        main([*SMALL, "--out", str(tmp_path / "r.jsonl"), *flag])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice" in err and "Traceback" not in err
    assert not (tmp_path / "r.jsonl").exists()
