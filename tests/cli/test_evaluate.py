"""`forerun eval`: bad input, kill -9 and SIGINT mid-run then --resume (the final file equals an
uninterrupted run's, timings aside, no duplicates), strict --json, and the report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forerun.cli.evaluate import VOLATILE_FIELDS
from forerun.cli.main import main
from forerun.eval.harness.runs import load_run

ARGS = ["eval", "--model", "tiny", "--datasets", "math500,mmlu", "--methods",
        "greedy,power-mh,presto-power-mh,power-smc", "--limit", "3", "--n", "16", "--K", "4", "--smc-block", "4"]
TOTAL = 2 * 4 * 3
RUN_FILE_LINES = json.dumps({"key": "math500|greedy|p0|1", "dataset": "math500", "method": "greedy", "prompt_id": "p0",
                             "seed": 1, "correct": True, "call_time_s": 1.0, "num_calls": 1, "all_calls": 1,
                             "time_per_call_s": 1.0, "wall_s": 1.1, "log_likelihood": -1.0, "confidence": -1.0,
                             "response_ids": [1, 2], "settings": {}, "model": "m"}) + "\n"
"""A run file of one finished item, which `eval report` reports."""


def _strict(text: str):
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


def _comparable(path: Path) -> list[dict]:
    recs = load_run(path, repair=False)
    keys = [r["key"] for r in recs]
    assert len(keys) == len(set(keys)), "duplicate items"
    return sorted(({k: v for k, v in r.items() if k not in VOLATILE_FIELDS} for r in recs), key=lambda r: r["key"])


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _start(out: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "forerun.cli.main", *ARGS, "--out", str(out), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def _wait_for_lines(proc: subprocess.Popen, path: Path, n: int, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while _lines(path) < n:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"run ended or stalled before {n} lines: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.02)


@pytest.mark.parametrize("argv, message", [
    (["eval", "--datasets", "nope", "--out", "{tmp}/r.jsonl"], "unknown dataset"),
    (["eval", "--dataset", "nope", "--out", "{tmp}/r.jsonl"], "unknown dataset"),  # bench presto's spelling
    (["eval", "--datasets", "math500", "--methods", "power-mhh", "--out", "{tmp}/r.jsonl"], "unknown method"),
    (["eval", "--datasets", "math500", "--out", "{tmp}/missing/r.jsonl"], "does not exist"),
    (["eval", "--datasets", "math500", "--out", "{tmp}"], "is a directory"),
    (["eval", "--datasets", "math500", "--out", "{tmp}/full.jsonl"], "--resume"),
    (["eval", "--datasets", "math500"], "--out"),
    (["eval", "--methods", "greedy", "--out", "{tmp}/r.jsonl"], "--datasets is required"),
    (["eval", "--datasets", "lcb-v6", "--out", "{tmp}/r.jsonl", "--dataset-file", "lcb-v6"], "expected NAME=PATH"),
    (["eval", "--datasets", "lcb-v6", "--out", "{tmp}/r.jsonl", "--dataset-file", "lcb-v9={tmp}/full.jsonl"],
     "unknown dataset"),
    (["eval", "--datasets", "math500", "--out", "{tmp}/r.jsonl", "--dataset-file", "lcb-v6={tmp}/full.jsonl"],
     "not among --datasets"),
    (["eval", "--datasets", "lcb-v6", "--out", "{tmp}/r.jsonl", "--dataset-file", "lcb-v6={tmp}/absent.jsonl"],
     "no such file"),
    (["eval", "--datasets", "lcb-v6", "--out", "{tmp}/r.jsonl", "--data-dir", "{tmp}"], "not shipped"),
    (["eval", "report", "{tmp}/none.jsonl", "--out", "{tmp}/rep"], "no such run file"),
    (["eval", "report", "{tmp}/full.jsonl", "--out", "{tmp}/full.jsonl"], "not a directory"),
    (["eval", "report", "{tmp}/bad.jsonl", "--out", "{tmp}/rep"], "not a JSON line"),
    (["eval", "report", "{tmp}/full.jsonl", "--out", ""], "--out must not be empty"),  # was: the current folder
    (["eval", "--datasets", "math500", "--out", "{tmp}/full.jsonl/r.jsonl"], "is not a directory"),
    (["eval", "--datasets", "math500", "--out", "/dev/null"], "is not a regular file"),
    (["eval", "--datasets", ",", "--out", "{tmp}/r.jsonl"], "--datasets: item 1 of the comma-separated list ',' is "
     "empty"),  # was: a header, 0 items, exit 0
    (["eval", "--datasets", "math500", "--methods", "greedy", "--alpha", "2", "--out", "{tmp}/r.jsonl"],
     "--alpha applies only to methods that sample"),  # was ignored: greedy-only items at "--alpha 2"
    (["eval", "--datasets", "math500", "--out", "{tmp}/r.jsonl", "--seed", str(2**63 - 1), "--samples", "2"],
     "is over 2**63 - 1"),  # was: a seed of 2**63, out of --seed's range
    (["eval", "report", "{tmp}/rep/summary.json", "--out", "{tmp}/rep"], "is also the RUN.jsonl input"),
    (["eval", "report", "{tmp}/full.jsonl", "--out", "{tmp}/dir_rep"], "is a directory; the report writes a file"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "full.jsonl").write_text('{"key": "a"}\n')
    (tmp_path / "bad.jsonl").write_text("garbage\n")
    (tmp_path / "rep").mkdir()
    (tmp_path / "dir_rep" / "report.md").mkdir(parents=True)
    (tmp_path / "rep" / "summary.json").write_text(RUN_FILE_LINES)  # a run file named as one of the report's files
    rc = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "r.jsonl").exists()
    assert (tmp_path / "rep" / "summary.json").read_text() == RUN_FILE_LINES  # an input is never written over


def test_kill_and_interrupt_then_resume_equals_an_uninterrupted_run(tmp_path, capsys):
    run = tmp_path / "run.jsonl"
    proc = _start(run)
    _wait_for_lines(proc, run, 4)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    at_kill = _lines(run)
    assert 4 <= at_kill < TOTAL, "the kill must land in the middle of the run"
    with open(run, "ab") as fh:  # what a kill inside a write would leave: a partial last line
        fh.write(b'{"key": "math500|power-smc|x|10086", "resp')

    proc = _start(run, "--resume")
    _wait_for_lines(proc, run, at_kill + 2)  # the torn tail was repaired, new lines follow
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and b"interrupted" in err and b"Traceback" not in err
    assert _lines(run) < TOTAL

    assert main([*ARGS, "--out", str(run), "--resume"]) == 0
    reference = tmp_path / "reference.jsonl"
    assert main([*ARGS, "--out", str(reference)]) == 0
    capsys.readouterr()
    got, want = _comparable(run), _comparable(reference)
    assert len(got) == TOTAL and got == want
    assert run.read_bytes().endswith(b"\n")

    # resuming a finished run does nothing; --json output is strict JSON
    assert main([*ARGS, "--out", str(run), "--resume", "--json"]) == 0
    summary = _strict(capsys.readouterr().out)
    assert summary["written_now"] == 0 and summary["items"] == TOTAL
    # a run without --forced-answer says so: its cells' forced fields are null for that reason
    assert summary["forced_answer"] is False and all(c["forced_accuracy"] is None for c in summary["cells"])
    assert main(["eval", "report", str(run), "--out", str(tmp_path / "rep"), "--json"]) == 0
    rep = _strict(capsys.readouterr().out)
    assert {Path(f).name for f in rep["files"]} >= {"report.md", "summary.json", "accuracy_vs_latency.png", "speedup.png"}
    assert rep["table7"] and all(r["identical_chains"] == r["pairs"] for r in rep["table7"])


def test_resume_refuses_other_settings(tmp_path, capsys):
    run = tmp_path / "run.jsonl"
    small = ["eval", "--model", "tiny", "--datasets", "mmlu", "--methods", "greedy", "--limit", "1", "--n", "4"]
    assert main([*small, "--out", str(run)]) == 0
    capsys.readouterr()
    assert main([*small[:-1], "5", "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "other settings" in err and err.count("\n") == 1


@pytest.mark.parametrize("made, header, resumed, refused", [
    # was refused ("alpha (2.0 -> 4.0)"): greedy is argmax; none of these settings reaches it
    ("greedy", {"alpha": 2.0, "beta": 2.0, "K": 2, "block": 2, "npf": 3, "best_of": 2, "smc_particles": 3,
                "fixed_horizon": True}, "greedy", False),
    ("low-temp", {"alpha": 2.0}, "low-temp", True),  # samples at τ = 1/α
    ("greedy", {"alpha": 2.0}, "greedy,low-temp", True),  # the method added now uses α: the header's must hold
    ("low-temp", {"alpha": 2.0}, "greedy", True),  # the file's low-temp results were made at the header's α
    ("best-of-n", {"best_of_select": "logp0"}, "best-of-n", True),
    ("power-mh", {"beta": 2.0, "npf": 3, "smc_block": 2, "best_of": 2}, "power-mh", False),
    ("entropy-cut", {"beta": 2.0}, "entropy-cut", True),
    ("power-mh", {"fixed_horizon": True}, "power-mh", True),
    ("presto-power-mh", {"npf": 3}, "presto-power-mh", True),
    ("power-smc", {"K": 2, "block": 2, "fixed_horizon": True, "beta": 2.0}, "power-smc", False),
    ("power-smc", {"smc_ess": 1.0}, "power-smc", True),
])
def test_resume_compares_only_the_settings_its_methods_use(tmp_path, capsys, made, header, resumed, refused):
    """A setting no method of the run (now or in the file) uses cannot make a result differ, so it does not block
    --resume; one that a method uses does.  The run file's header is edited to hold other values (as a forerun that
    let them be given wrote them); the expected outcomes are from what each method is (harness.methods)."""
    run = tmp_path / "run.jsonl"
    small = ["eval", "--model", "tiny", "--datasets", "mmlu", "--limit", "1", "--n", "4", "--K", "2", "--out", str(run)]
    small = small if any(m in made + resumed for m in ("power-mh", "entropy-cut")) else small[:-4] + small[-2:]
    assert main([*small, "--methods", made]) == 0
    first, rest = run.read_text().split("\n", 1)
    head = json.loads(first)
    assert set(header) <= set(head["settings"])
    head["settings"].update(header)
    run.write_text(json.dumps(head) + "\n" + rest)
    before = run.read_bytes()
    capsys.readouterr()
    assert main([*small, "--resume", "--methods", resumed, "--quiet"]) == (2 if refused else 0)
    err = capsys.readouterr().err
    if refused:
        assert "other settings" in err and err.count("\n") == 1 and run.read_bytes() == before
    else:
        assert err == ""


def test_a_line_torn_inside_a_character_is_repaired_and_a_run_without_its_header_is_not_resumed(tmp_path, capsys):
    """A full disk can cut the last line inside a UTF-8 character (run files keep non-ASCII text as is): resume
    and report repair or skip it as they do an ASCII cut.  A file holding records but no header has nothing to
    check the settings against: resuming it is refused (it used to append other settings' items); a blank file
    gets its header first."""
    small = ["eval", "--model", "tiny", "--datasets", "mmlu", "--methods", "greedy", "--limit", "2", "--n", "4"]
    run = tmp_path / "run.jsonl"
    assert main([*small, "--out", str(run)]) == 0
    lines = run.read_bytes().split(b"\n")
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(b"\n".join(lines[:2]) + b"\n" + lines[2][:lines[2].index(b'"response"') + 13] + "é".encode()[:1])
    assert main(["eval", "report", str(torn), "--out", str(tmp_path / "rep")]) == 0
    assert main([*small, "--out", str(torn), "--resume"]) == 0
    assert _comparable(torn) == _comparable(run)
    headless = tmp_path / "headless.jsonl"
    headless.write_bytes(b"\n".join(lines[1:]))
    capsys.readouterr()
    assert main([*small[:-1], "8", "--out", str(headless), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "no header line" in err and err.count("\n") == 1
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n")
    assert main([*small, "--out", str(blank), "--resume"]) == 0
    assert main([*small[:-1], "8", "--out", str(blank), "--resume"]) == 2
    assert "other settings: n (4 -> 8)" in capsys.readouterr().err


def test_a_run_killed_while_writing_its_header_is_resumed(tmp_path, capsys):
    """Killed mid-header, the file holds one unterminated line: without --resume the hint says to pass --resume,
    and --resume then runs it from the start (it used to refuse it as 'not a forerun run file')."""
    small = ["eval", "--model", "tiny", "--datasets", "mmlu", "--methods", "greedy", "--limit", "1", "--n", "4"]
    run = tmp_path / "run.jsonl"
    assert main([*small, "--out", str(run)]) == 0
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(run.read_bytes()[:40])
    capsys.readouterr()
    assert main([*small, "--out", str(torn)]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert main([*small, "--out", str(torn), "--resume"]) == 0
    assert _comparable(torn) == _comparable(run)


@pytest.mark.parametrize("first, resume, edited", [("2", "3", 1), ("3", "1", 2)],
                         ids=["edited row loaded now", "edited row past a smaller --limit"])
def test_resuming_with_another_dataset_file_under_the_same_ids_is_refused(tmp_path, capsys, first, resume, edited):
    """Items are keyed by prompt id (LiveCodeBench's are row numbers): resuming with another or an edited dataset
    file used to mix results graded against the old prompts with new ones.  Each record carries its prompt's
    fingerprint; a resume whose prompt differs under the same id is refused before the model loads - also for the
    records a smaller --limit keeps in the file (and in its report), which were resumed unchecked before."""
    data = tmp_path / "mmlu.jsonl"
    rows = [{"question": f"Q{i}?", "subject": "s", "choices": ["a", "b", "c", "d"], "answer": i % 4}
            for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    small = ["eval", "--model", "tiny", "--datasets", "mmlu", "--methods", "greedy", "--n", "4",
             "--dataset-file", f"mmlu={data}"]
    run = tmp_path / "run.jsonl"
    assert main([*small, "--limit", first, "--out", str(run)]) == 0
    assert main([*small, "--limit", resume, "--out", str(run), "--resume"]) == 0  # the same file: fine
    rows[edited]["answer"] = (rows[edited]["answer"] + 1) % 4  # an edited gold under the same id
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = run.read_bytes()
    capsys.readouterr()
    assert main([*small, "--limit", resume, "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another prompt than the one loaded now" in err and run.read_bytes() == before


def _reworded_mc(p):
    """Another forerun's multiple-choice instruction: the same row, the same option letters, other words."""
    options = "\n".join(f"{chr(65 + i)}) {c.strip()}" for i, c in enumerate(p.choices))
    return f"{p.question.strip()}\n\n{options}\n\nReply with the letter of the right option in \\boxed{{}}."


def test_resuming_after_the_instruction_wording_changed_is_refused(tmp_path, capsys, monkeypatch):
    """The row fingerprint (prompt_sha) does not see the instruction forerun wraps a row in: a forerun that words its
    instructions otherwise used to resume silently, mixing results of two prompts in one run.  Each record carries
    the fingerprint of the chat the model was shown (messages_sha, --system included); a resume under other wording
    is refused before the model loads, one line naming the dataset and prompt id, and the file is left as it was."""
    import hashlib

    from forerun.eval.datasets import prompt as prompt_module
    from forerun.eval.harness import items

    encoded, encode = [], items.chat_prompt_ids  # the chats the tokenizer gets: what messages_sha fingerprints

    def spy(tokenizer, chat, **kw):
        encoded.append(chat)
        return encode(tokenizer, chat, **kw)

    monkeypatch.setattr(items, "chat_prompt_ids", spy)
    small = ["eval", "--model", "tiny", "--datasets", "mmlu", "--methods", "greedy", "--n", "4"]
    run = tmp_path / "run.jsonl"
    assert main([*small, "--limit", "1", "--system", "Be brief.", "--out", str(run)]) == 0
    (rec,) = load_run(run)
    (chat,) = encoded
    assert chat[0] == {"role": "system", "content": "Be brief."} and len(chat) == 2
    assert rec["messages_sha"] == hashlib.sha256(json.dumps(chat, sort_keys=True).encode()).hexdigest()[:16]
    monkeypatch.setitem(prompt_module._USER_MESSAGE, "mc", _reworded_mc)
    before = run.read_bytes()
    capsys.readouterr()
    assert main([*small, "--limit", "2", "--system", "Be brief.", "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "worded otherwise" in err, err
    assert f"mmlu prompt {rec['prompt_id']!r}" in err and run.read_bytes() == before
    monkeypatch.undo()  # today's wording again: the same file resumes
    assert main([*small, "--limit", "2", "--system", "Be brief.", "--out", str(run), "--resume"]) == 0
    assert len(load_run(run)) == 2


def test_records_from_before_the_messages_fingerprint_still_resume(tmp_path, capsys, monkeypatch):
    """A run file written before messages_sha existed has nothing to compare the wording against: its records are
    not checked on that count (they still are on prompt_sha), and the resume appends records that carry one."""
    from forerun.eval.datasets import prompt as prompt_module

    small = ["eval", "--model", "tiny", "--datasets", "mmlu", "--methods", "greedy", "--n", "4"]
    run = tmp_path / "run.jsonl"
    assert main([*small, "--limit", "1", "--out", str(run)]) == 0
    header, *lines = run.read_text().splitlines()
    old = [json.loads(line) for line in lines]
    for rec in old:  # such files predate input_sha too
        del rec["messages_sha"], rec["input_sha"]
    run.write_text("".join(line + "\n" for line in [header, *map(json.dumps, old)]))
    monkeypatch.setitem(prompt_module._USER_MESSAGE, "mc", _reworded_mc)
    assert main([*small, "--limit", "2", "--out", str(run), "--resume"]) == 0, capsys.readouterr().err
    recs = load_run(run)
    assert [("messages_sha" in r, "input_sha" in r) for r in recs] == [(False, False), (True, True)]


def test_resuming_under_another_chat_template_is_refused(tmp_path, capsys, monkeypatch):
    """The same chat through another chat template under the same model name (an edited local model folder, a
    transformers release that renders the template otherwise) gives the model other token ids: each record keeps
    the fingerprint of the ids it was made from (input_sha), and a resume that would now give other ids is refused,
    one line naming the dataset and prompt id, the file left as it was."""
    import hashlib

    from forerun.eval.harness import items

    given, encode = [], items.chat_prompt_ids

    def spy(tokenizer, chat, **kw):
        given.append(encode(tokenizer, chat, **kw))
        return given[-1]

    monkeypatch.setattr(items, "chat_prompt_ids", spy)
    small = ["eval", "--model", "tiny", "--datasets", "mmlu", "--methods", "greedy", "--n", "4"]
    run = tmp_path / "run.jsonl"
    assert main([*small, "--limit", "1", "--out", str(run)]) == 0
    (rec,) = load_run(run)
    assert rec["input_sha"] == hashlib.sha256(json.dumps(given[0]).encode()).hexdigest()[:16]

    def other_template(tokenizer, chat, **kw):  # the same chat, rendered by another template
        tokenizer.chat_template = ("{% for m in messages %}### {{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
                                   "### assistant\n")
        return encode(tokenizer, chat, **kw)

    monkeypatch.setattr(items, "chat_prompt_ids", other_template)
    before = run.read_bytes()
    capsys.readouterr()
    assert main([*small, "--limit", "2", "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "other prompt tokens" in err and f"mmlu prompt {rec['prompt_id']!r}" in err, err
    assert run.read_bytes() == before
    monkeypatch.setattr(items, "chat_prompt_ids", encode)  # the model's own template again: the file resumes
    assert main([*small, "--limit", "2", "--out", str(run), "--resume"]) == 0
    assert len(load_run(run)) == 2


def test_a_response_longer_than_the_context_is_refused_before_any_item(tmp_path, capsys):
    run = tmp_path / "run.jsonl"
    rc = main(["eval", "--model", "tiny", "--datasets", "mmlu", "--methods", "greedy", "--limit", "1", "--n", "4096",
               "--out", str(run)])
    err = capsys.readouterr().err
    assert rc == 2 and "--n 4096: prompt (" in err and "exceeds the model context" in err and err.count("\n") == 1
    assert run.read_bytes() == b""  # no item ran (each used to be retried, then written as an error line)


def test_items_are_spread_over_every_backend_url(tmp_path, capsys):
    from forerun.runtime_ext.standin.server import StandInServer

    run = tmp_path / "run.jsonl"
    with StandInServer() as a, StandInServer() as b:
        rc = main(["eval", "--backend", a.url, "--backend", b.url, "--datasets", "mmlu", "--methods",
                   "greedy,power-mh,presto-power-mh,power-smc", "--limit", "2", "--n", "6", "--K", "2",
                   "--smc-block", "3", "--out", str(run), "--json"])
        urls = {a.url, b.url}
    assert rc == 0, capsys.readouterr().err
    recs = load_run(run)
    assert len(recs) == 8 and not [r for r in recs if r.get("error")]
    assert {r["backend"] for r in recs} == urls
    pm = {r["prompt_id"]: r["response_ids"] for r in recs if r["method"] == "power-mh"}
    pre = {r["prompt_id"]: r["response_ids"] for r in recs if r["method"] == "presto-power-mh"}
    assert pm == pre  # identical chains, whichever server ran them


def test_an_lcb_v6_file_is_evaluated_and_labelled_v6(tmp_path, capsys):
    from forerun.eval.datasets.loading import resolve_data_dir

    src = resolve_data_dir()
    if src.packaged:
        pytest.skip("the offline LCB copy is not available here")
    v6 = tmp_path / "lcb_release_v6.jsonl"  # stand-in rows: v6 has v5's schema
    v6.write_text("".join((src.path / "lcb.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:2]))
    run = tmp_path / "run.jsonl"
    assert main(["eval", "--model", "tiny", "--datasets", "lcb-v6", "--dataset-file", f"lcb-v6={v6}",
                 "--methods", "greedy", "--limit", "2", "--n", "8", "--out", str(run)]) == 0
    capsys.readouterr()
    recs = load_run(run, repair=False)
    assert sorted(r["prompt_id"] for r in recs) == ["lcb-v6-0", "lcb-v6-1"]
    assert {r["dataset"] for r in recs} == {"lcb-v6"}
    assert all(r["grade"] is not None for r in recs)


@pytest.mark.parametrize("server,methods,needs", [
    ({"plugin": False}, "greedy,entropy-cut", "entropy of p0"),
    ({"plugin": False}, "presto-multitry-mh", "extra temperatures"),
    ({"deterministic": False}, "greedy", "deterministic-inference"),
])
def test_a_server_that_cannot_serve_the_methods_is_refused_before_any_item(tmp_path, capsys, server, methods, needs):
    from forerun.runtime_ext.standin.server import StandInServer

    run = tmp_path / "run.jsonl"
    with StandInServer(**server) as srv:
        rc = main(["eval", "--backend", srv.url, "--datasets", "mmlu", "--methods", methods, "--limit", "1",
                   "--n", "4", "--out", str(run)])
        assert srv.generate_bodies() == []
    err = capsys.readouterr().err
    assert rc == 2 and needs in err and err.count("\n") == 1, err
    assert load_run(run) == []


def test_streaming_presto_is_an_eval_method_compared_with_its_sequential_sampler(tmp_path, capsys):
    """`presto-<kind>-streaming` runs through `forerun eval` (--K applies to it: an MH method), and the report pairs
    it with its sequential sampler: Table 7 row, identical chains, and a row in the every-sampler table."""
    run = tmp_path / "run.jsonl"
    assert main(["eval", "--model", "tiny", "--datasets", "mmlu", "--methods", "presto-power-mh-streaming,power-mh",
                 "--limit", "2", "--n", "8", "--K", "4", "--out", str(run)]) == 0
    capsys.readouterr()
    recs = load_run(run, repair=False)
    assert {r["extra"]["sampler"] for r in recs if r["method"] == "presto-power-mh-streaming"} == \
        {"streaming-presto-power-mh"}
    assert main(["eval", "report", str(run), "--out", str(tmp_path / "rep"), "--json"]) == 0
    rep = _strict(capsys.readouterr().out)
    (row,) = rep["table7"]
    assert (row["sampler"], row["presto"]) == ("power-mh", "presto-power-mh-streaming")
    assert row["identical_chains"] == row["pairs"] == 2
    assert {(r["scope"], r["method"]) for r in rep["samplers"]} >= {("all", "presto-power-mh-streaming"),
                                                                    ("mmlu", "power-mh")}


def test_mh_settings_apply_to_a_run_of_streaming_methods_only(tmp_path, capsys):
    """--K and --block are MH settings: a run of presto-*-streaming methods alone takes them (not refused as
    inapplicable), and its records carry them."""
    run = tmp_path / "run.jsonl"
    assert main(["eval", "--model", "tiny", "--datasets", "mmlu", "--methods", "presto-entropy-cut-streaming",
                 "--limit", "1", "--n", "4", "--K", "2", "--block", "2", "--out", str(run)]) == 0, \
        capsys.readouterr().err
    (rec,) = load_run(run, repair=False)
    assert (rec["settings"]["K"], rec["settings"]["block"], rec["settings"]["streaming"]) == (2, 2, True)


def test_a_budget_for_a_dataset_the_run_does_not_have_is_refused(tmp_path, capsys):
    """`--n aime=8 --datasets aime2024` ran AIME 2024 at its default budget (214), the override silently unused."""
    run = tmp_path / "run.jsonl"
    rc = main(["eval", "--model", "tiny", "--datasets", "aime2024", "--methods", "greedy", "--limit", "1",
               "--n", "aime=8", "--out", str(run)])
    err = capsys.readouterr().err
    assert rc == 2 and "--n aime=8: aime is not among --datasets (aime2024)" in err and err.count("\n") == 1
    assert not run.exists()


def test_a_block_that_does_not_divide_a_datasets_budget_is_refused_before_any_item(tmp_path, capsys):
    """--block 8 divides math500's n = 32 but not AIME's default 214: the run wrote math500's items, then stopped
    at the first AIME item (exit 2, a half-done run file)."""
    run = tmp_path / "run.jsonl"
    rc = main(["eval", "--model", "tiny", "--datasets", "math500,aime", "--methods", "power-mh", "--limit", "1",
               "--n", "math500=32", "--block", "8", "--K", "2", "--out", str(run)])
    err = capsys.readouterr().err
    assert rc == 2 and "--block B=8 does not divide --n=214 of aime" in err and err.count("\n") == 1
    assert not run.exists()


@pytest.mark.parametrize("methods,alpha,message", [
    ("power-smc", "0.5", "--methods power-smc: --alpha must be >= 1"),  # Power-SMC sharpens: α < 1 is not its target
    ("greedy,low-temp", "1e-320", "--methods low-temp: --alpha 1e-320 is too small: τ = 1/α overflows to inf"),
    ("power-mh", "1e-320", "--methods power-mh: --alpha 1e-320 is too small"),
    ("presto-entropy-cut", "1e-320", "--methods presto-entropy-cut: --alpha 1e-320 is too small"),
    ("power-smc", "4e6", "--methods power-smc: τ (1/α) = 2.5e-07 is below 1e-06"),  # q_τ reported as p0: wrong weights
])
def test_an_alpha_a_method_cannot_run_with_is_refused_before_any_item(tmp_path, capsys, methods, alpha, message):
    """The method's own settings were built per item, after the model loaded: every item an error line after two
    retries, exit 1, a run file of failures."""
    run = tmp_path / "run.jsonl"
    rc = main(["eval", "--model", "tiny", "--datasets", "math500", "--methods", methods, "--limit", "1",
               "--n", "4", "--alpha", alpha, "--out", str(run)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1, err
    assert not run.exists()


def test_the_method_error_flags_follow_the_configs_the_methods_build():
    """A method's config error names the eval flags for its fields (`evaluate._method_config_dests`): the map is of
    the config `MethodRunner.config` builds, for every method, and each dest it names is an eval option."""
    import dataclasses

    from forerun.cli.evaluate import _method_config_dests
    from forerun.cli.main import build_parser
    from forerun.eval.harness.methods import MethodRunner
    from forerun.eval.harness.settings import EvalSettings, parse_methods

    args = build_parser().parse_args(["eval", "--datasets", "math500", "--out", "x.jsonl"])
    runner = MethodRunner(None, EvalSettings(n=8))
    for method in parse_methods("all"):
        config_type, dests = _method_config_dests(method)
        assert type(runner.config(method, 1)) is config_type, method
        fields = {f.name for f in dataclasses.fields(config_type)}
        assert set(dests) <= fields and all(hasattr(args, d) for d in dests.values()), (method, dests)
