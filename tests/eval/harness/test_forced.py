"""`forerun eval --forced-answer`: the forcing text follows the response cut at its first EOS; a response with no
answer is graded correct by its forced pass when the continuation supplies the answer (graded like a response);
code datasets get no forced pass; its tokens stay out of tokens_decoded; the header records it and --resume
refuses the other choice; the report and summary.json show it in a column of its own."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from forerun.cli.main import main
from forerun.eval.datasets.loading import load_prompts
from forerun.eval.graders.choice import extract_choice
from forerun.eval.graders.math_answers import extract_final_answer
from forerun.eval.harness import forced, items, methods
from forerun.eval.harness.forced import FORCED_ANSWERS, forced_prefix, forcing_header, graded_text
from forerun.eval.harness.report import summarize
from forerun.eval.harness.report_files import write_report
from forerun.eval.harness.runs import header_differences, read_run, run_header

SMALL = ["eval", "--model", "tiny", "--datasets", "math500,mmlu,humaneval", "--methods", "greedy", "--limit", "1",
         "--n", "4"]


def test_forced_prefix_drops_the_eos_and_what_follows_it():
    assert forced_prefix([1, 2], [5, 7, 2, 9, 2], (2,), [40, 41]) == [1, 2, 5, 7, 40, 41]
    assert forced_prefix([1], [5, 7], (2,), [40]) == [1, 5, 7, 40]
    assert forced_prefix([1], [2, 5], (2, 3), [40]) == [1, 40]
    assert set(FORCED_ANSWERS) == {"math", "mc"}  # code: no forced pass


def _stub_method_and_continuation(monkeypatch):
    """The method answers "I think" + EOS + a boxed junk answer after the EOS (never graded); the forced pass
    continues with the gold answer.  Returns the calls the forced pass got: (prefix, max_tokens, tokenizer)."""
    seen: dict = {"calls": []}
    real_prepare = items.ItemRunner.prepare

    def prepare(self, todo):
        seen["tok"] = self.runtimes[0].tokenizer
        return real_prepare(self, todo)

    def run(self, method, prompt_ids, prompt_id, seed):
        tok = seen["tok"]
        ids = tok.encode("I think", add_special_tokens=False) + [self.eos_token_ids[0]]
        ids += tok.encode(" \\boxed{999} (D)", add_special_tokens=False)
        return {"response_ids": ids, "finished": True, "call_time_s": 0.0, "num_calls": 1, "all_calls": 1,
                "transitions": None, "transitions_per_call": None, "time_per_call_s": 0.0, "log_likelihood": -1.0,
                "confidence": -1.0, "tokens_decoded": 7, "extra": {}, "wall_s": 0.0}

    golds = seen["golds"] = {"math": load_prompts("math500", limit=1)[0].answer + "}$",
                             "mc": load_prompts("mmlu", limit=1)[0].answer + ")"}

    def continuation(backend, prefix, max_tokens):
        tok = seen["tok"]
        seen["calls"].append((list(prefix), max_tokens))
        text = tok.decode(prefix)
        kind = next(k for k, f in FORCED_ANSWERS.items() if text.endswith(f.text))
        return tok.encode(golds[kind], add_special_tokens=False) + [tok.eos_token_id]

    monkeypatch.setattr(items.ItemRunner, "prepare", prepare)
    monkeypatch.setattr(methods.MethodRunner, "run", run)
    monkeypatch.setattr(forced, "greedy_continuation", continuation)
    return seen


def test_an_answerless_response_is_graded_correct_by_its_forced_pass(tmp_path, capsys, monkeypatch):
    seen = _stub_method_and_continuation(monkeypatch)
    run = tmp_path / "run.jsonl"
    assert main([*SMALL, "--forced-answer", "--out", str(run)]) == 0
    capsys.readouterr()
    header, recs = read_run(run)
    assert header["settings"]["forced_answer"] is True
    by = {r["dataset"]: r for r in recs}
    tok = seen["tok"]
    assert len(seen["calls"]) == 2  # math and mc; none for code
    for (prefix, max_tokens), ds in zip(seen["calls"], ("math500", "mmlu")):
        r, how = by[ds], FORCED_ANSWERS[by[ds]["grade"]["grader"]]
        tail = prefix[r["prompt_tokens"]:]  # response before its EOS, then the forcing text
        assert tail == tok.encode("I think", add_special_tokens=False) + tok.encode(how.text, add_special_tokens=False)
        assert max_tokens == how.max_tokens
        assert r["response"] == "I think" and r["correct"] is False  # the response has no answer
        assert r["forced_correct"] is True and r["forced_grade"]["correct"] is True
        gold = seen["golds"][r["grade"]["grader"]]
        assert r["forced_text"] == how.text + gold  # forcing text + continuation (its EOS cut)
        assert r["forced_tokens"] == len(tok.encode(gold, add_special_tokens=False)) + 1  # the EOS too
        assert r["tokens_decoded"] == 7  # the method's count, the forced tokens apart
    code = by["humaneval"]
    assert code["forced_correct"] is None and code["forced_text"] is None and code["forced_tokens"] == 0
    summary = summarize(recs)
    cells = {c["dataset"]: c for c in summary["cells"]}
    assert cells["math500"]["accuracy"] == 0 and cells["math500"]["forced_accuracy"] == 1
    assert cells["humaneval"]["forced_accuracy"] is None


@pytest.mark.parametrize("continuation,letter", [
    ("B)", "B"),
    ("B)\n\nA) 3", "B"),  # the options of a next question after the answer
    ("B)\nThe answer is (C", "B"),  # a restart on a later line
    ("B) 42\nC", "B"),
    ("\nB)\nA", "B"),  # the first non-blank line
    (")\nA", None),  # no letter where the forcing text opens one: none read from a later line
])
def test_the_mc_forced_pass_reads_the_letter_the_forcing_text_opens(continuation, letter):
    """Graded as the whole text, a later line of the 8-token continuation overrode the forced letter (the last
    label or explicit answer wins in a response)."""
    assert extract_choice("I think about the orbitals" + graded_text(FORCED_ANSWERS["mc"], continuation)) == letter
    assert graded_text(FORCED_ANSWERS["math"], "42}$\nmore") == FORCED_ANSWERS["math"].text + "42}"  # its box


def test_a_later_line_of_the_forced_continuation_does_not_override_its_letter(tmp_path, capsys, monkeypatch):
    seen = _stub_method_and_continuation(monkeypatch)
    gold = seen["golds"]["mc"][0]
    other = "A" if gold != "A" else "B"
    seen["golds"]["mc"] = f"{gold})\n\n{other}) 3"
    run = tmp_path / "run.jsonl"
    assert main([*SMALL, "--forced-answer", "--out", str(run)]) == 0
    capsys.readouterr()
    r = next(r for r in read_run(run)[1] if r["dataset"] == "mmlu")
    assert r["forced_correct"] is True and r["forced_grade"]["extracted"] == gold
    assert r["forced_text"] == FORCED_ANSWERS["mc"].text + f"{gold})\n\n{other}) 3"  # recorded whole


@pytest.mark.parametrize("continuation,answer", [
    ("42}$", "42"),
    ("42}$\n\nNext problem: what is 6*7+1? Final answer: $\\boxed{43}$", "42"),  # a next problem's box
    ("42}$. Wait, that is wrong: $\\boxed{43}$", "42"),  # a restart after the forced box closed
    ("\\frac{1}{2}}$ and \\boxed{43}", "\\frac{1}{2}"),  # braces nested in the forced box
    ("\\{1, 2\\}}$ \\boxed{43}", "\\{1, 2\\}"),  # escaped braces balance as the grader counts them
])
def test_the_math_forced_pass_reads_the_box_the_forcing_text_opens(continuation, answer):
    """Graded as the whole text, a later box of the 32-token continuation overrode the forced answer (the last
    \\boxed{} wins in a response)."""
    assert extract_final_answer("So we compute" + graded_text(FORCED_ANSWERS["math"], continuation)) == answer


@pytest.mark.parametrize("response,continuation,answer", [
    ("So we compute", "42$", "42"),  # the math closed, the box not
    ("Trying $x=3$ gives $\\boxed{9}$, which fails.", "42$", "42"),  # not the response's earlier box
    ("So we compute", "42$ and the next problem asks for 43 + 1, which is 44", "42"),  # not the rambling's number
    ("So we compute", "42\n\nProblem 2: compute 6+1. Answer: 7", "42"),  # a line break ends it
    ("So we compute", "42. This holds since 6 times 7 is 42 and 7 times 7 is 49", "42"),  # so does a sentence
    ("So we compute", "\\frac{1}{2}$. To see this, note that 3", "\\frac{1}{2}"),  # braces inside the box
    ("So we compute", "\\$18.90$ in all", "\\$18.90"),  # an escaped dollar is part of the answer
    ("So we compute", "3.5$", "3.5"),  # a decimal point is not a full stop
    ("Trying $\\boxed{9}$ fails.", "\n\n42\n\nNext", "42"),  # the answer on a line of its own
])
def test_a_forced_box_that_never_closes_is_graded_on_the_answer_written_in_it(response, continuation, answer):
    """The continuation never closes the box the forcing text opened: the whole of it was graded, so the response's
    earlier box, or whatever the rambling wrote last, was read instead of the forced answer ("42$" alone read
    "\\boxed{42", and math-verify found nothing in it).  By hand: the answer is what was written in the box, up to
    where the math, line or sentence ends."""
    assert extract_final_answer(response + graded_text(FORCED_ANSWERS["math"], continuation)) == answer


def test_a_forced_answer_ends_where_the_continuation_closes_its_reasoning():
    """A response cut inside its thinking gets the forcing text; a continuation that then closes the reasoning
    ("C)</think>") must keep its answer: the grader reads past the last "</think>", which left nothing to read."""
    from forerun.eval.graders import after_reasoning

    mc = after_reasoning("<think>I ponder" + graded_text(FORCED_ANSWERS["mc"], "C)</think>\n\nThe answer is (A)"))
    assert extract_choice(mc) == "C"
    math = after_reasoning("<think>I ponder" + graded_text(FORCED_ANSWERS["math"], "42</think> so \\boxed{43}"))
    assert extract_final_answer(math) == "42"


def test_an_empty_forced_box_leaves_the_responses_own_answer():
    """Nothing written in the box (no room left, or "$" at once): no forced answer, the response's is graded."""
    for continuation in ("", "  ", "$ is undefined"):
        assert extract_final_answer("So $\\boxed{7}$." + graded_text(FORCED_ANSWERS["math"], continuation)) == "7"


def test_a_later_box_of_the_forced_continuation_does_not_override_its_answer(tmp_path, capsys, monkeypatch):
    seen = _stub_method_and_continuation(monkeypatch)
    gold = load_prompts("math500", limit=1)[0].answer
    continued = f"{gold}}}$\n\nNext problem: what is 2+2? Final answer: $\\boxed{{4}}$"
    seen["golds"]["math"] = continued
    run = tmp_path / "run.jsonl"
    assert main([*SMALL, "--forced-answer", "--out", str(run)]) == 0
    capsys.readouterr()
    r = next(r for r in read_run(run)[1] if r["dataset"] == "math500")
    assert r["forced_correct"] is True and r["forced_grade"]["extracted"] == gold
    assert r["forced_text"] == FORCED_ANSWERS["math"].text + continued  # recorded whole


def test_forced_pass_changes_nothing_of_the_method_and_resume_checks_it(tmp_path, capsys):
    plain, with_forced = tmp_path / "plain.jsonl", tmp_path / "forced.jsonl"
    assert main([*SMALL, "--out", str(plain)]) == 0
    assert main([*SMALL, "--forced-answer", "--out", str(with_forced)]) == 0
    capsys.readouterr()
    (h0, a), (h1, b) = read_run(plain), read_run(with_forced)
    assert h0["settings"]["forced_answer"] is False and h1["settings"]["forced_answer"] is True
    assert h0["forced_answers"] is None and h1["forced_answers"] == forcing_header(True)
    for x, y in zip(a, b):
        assert (x["response_ids"], x["tokens_decoded"], x["correct"]) == (y["response_ids"], y["tokens_decoded"],
                                                                          y["correct"])
        assert "forced_correct" not in x
    for r in b:  # the real engine ran the forced pass: at most its budget, never for code
        how = FORCED_ANSWERS.get(r["grade"]["grader"])
        assert (0 < r["forced_tokens"] <= how.max_tokens) if how else r["forced_tokens"] == 0
    before = with_forced.read_bytes()
    assert main([*SMALL, "--out", str(with_forced), "--resume"]) == 2
    assert "forced_answer (True -> False)" in capsys.readouterr().err
    assert main([*SMALL, "--forced-answer", "--out", str(plain), "--resume"]) == 2
    assert "forced_answer (False -> True)" in capsys.readouterr().err
    assert with_forced.read_bytes() == before
    assert main([*SMALL, "--forced-answer", "--out", str(with_forced), "--resume"]) == 0


def test_the_forcing_texts_are_a_resume_key():
    """A --forced-answer run records each kind's forcing text and budget; a resume with other texts (a newer
    forerun) is refused by name, and a header written before they were recorded is not."""
    on = forcing_header(True)
    assert on == {kind: {"text": f.text, "max_tokens": f.max_tokens} for kind, f in FORCED_ANSWERS.items()}
    assert forcing_header(False) is None
    made = run_header({"forced_answer": True}, "m", "float32", 1, forced_answers=on)
    other = {**on, "math": {**on["math"], "text": "\n\nAnswer: "}}
    assert header_differences(made, run_header({"forced_answer": True}, "m", "float32", 1, forced_answers=other)) == [
        f"forced_answers ({on!r} -> {other!r})"]
    assert header_differences(made, run_header({"forced_answer": True}, "m", "float32", 1, forced_answers=on)) == []
    before = run_header({"forced_answer": True}, "m", "float32", 1)
    assert header_differences(before, made) == []


def test_a_header_from_before_the_option_ran_without_it():
    old = run_header({"n": 4, "alpha": 4.0}, "m", "float32", 1)
    assert header_differences(old, run_header({"n": 4, "alpha": 4.0, "forced_answer": False}, "m", "float32", 1)) == []
    assert header_differences(old, run_header({"n": 4, "alpha": 4.0, "forced_answer": True}, "m", "float32", 1)) == [
        "forced_answer (False -> True)"]


def _rec(ds, pid, correct, forced_correct, grader="math", **extra):
    rec = {"key": f"{ds}|greedy|{pid}|1", "dataset": ds, "method": "greedy", "prompt_id": pid, "seed": 1,
           "correct": correct, "grade": {"grader": grader, "extracted": None}, "response_ids": [1], "settings": {},
           "model": "m", "tokens_decoded": 4, "wall_s": 1.0}
    if forced_correct != "absent":
        rec.update(forced_correct=forced_correct, forced_tokens=0 if forced_correct is None else 3)
    return {**rec, **extra}


def test_the_report_shows_forced_accuracy_in_its_own_column(tmp_path):
    recs = [_rec("math500", f"p{i}", False, i < 3) for i in range(4)]
    recs.append(_rec("math500", "p9", False, False, error="boom"))  # an error: wrong, forced too
    recs += [_rec("humaneval", f"h{i}", i == 0, None, grader="code") for i in range(2)]
    summary, _ = write_report(recs, tmp_path / "rep", run_path="run.jsonl", command="forerun eval report")
    cells = {c["dataset"]: c for c in summary["cells"]}
    math500 = cells["math500"]
    assert (math500["accuracy"], math500["forced_accuracy"], math500["forced_correct"]) == (0, 3 / 5, 3)
    lo, hi = math500["forced_ci95"]
    assert lo <= 3 / 5 <= hi and lo < hi and math500["forced_tokens"] == 3
    assert cells["humaneval"]["forced_accuracy"] is None and cells["humaneval"]["forced_ci95"] is None
    saved = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert saved["forced_answer"] is True
    assert {c["dataset"]: c["forced_accuracy"] for c in saved["cells"]} == {"math500": 0.6, "humaneval": None}
    lines = (tmp_path / "rep" / "report.md").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|") and "forced answer % [95 % CI]" in ln)
    table = [ln for ln in itertools.takewhile(lambda ln: ln.startswith("|"), lines[start:])]  # the accuracy table
    head = [h.strip() for h in table[0].strip("|").split("|")]
    col = head.index("forced answer % [95 % CI]")
    assert head[col - 1] == "pass@1 % [95 % CI]"  # beside the normal accuracy
    rows = {r.strip("|").split("|")[0].strip(): [x.strip() for x in r.strip("|").split("|")] for r in table[2:4]}
    assert rows["math500"][col].startswith("60 [") and rows["humaneval"][col] == "–"
    assert rows["math500"][col - 1].startswith("0 [")

    plain = [_rec("math500", f"p{i}", i == 0, "absent") for i in range(3)]
    summary, _ = write_report(plain, tmp_path / "plain", run_path="run.jsonl", command="forerun eval report")
    (cell,) = summary["cells"]
    assert summary["forced_answer"] is False and cell["forced_accuracy"] is None and cell["forced_ci95"] is None
    assert math.isnan(cell["forced_tokens"])
    assert "forced" not in (tmp_path / "plain" / "report.md").read_text()


def _responses_that_fill_the_context(monkeypatch) -> dict:
    """Every method's response fills the context (`seen["ctx"]` tokens with the prompt) and ends with the item's
    right answer; `seen` gets the runtime's tokenizer and, when `ctx` is not set, the runtime's max_context."""
    seen: dict = {}
    real_prepare = items.ItemRunner.prepare

    def prepare(self, todo):
        seen["tok"] = self.runtimes[0].tokenizer
        seen.setdefault("ctx", self.runtimes[0].max_context)
        return real_prepare(self, todo)

    def run(self, method, prompt_ids, prompt_id, seed):
        tok = seen["tok"]
        answer = tok.encode(" \\boxed{" + load_prompts("math500", limit=1)[0].answer + "}", add_special_tokens=False)
        filler = tok.encode(" ", add_special_tokens=False)[:1] * (seen["ctx"] - len(prompt_ids) - len(answer))
        return {"response_ids": filler + answer, "finished": False, "call_time_s": 0.0, "num_calls": 1,
                "all_calls": 1, "transitions": None, "transitions_per_call": None, "time_per_call_s": 0.0,
                "log_likelihood": -1.0, "confidence": -1.0, "tokens_decoded": 1, "extra": {}, "wall_s": 0.0}

    monkeypatch.setattr(items.ItemRunner, "prepare", prepare)
    monkeypatch.setattr(methods.MethodRunner, "run", run)
    return seen


def test_a_response_that_fills_the_context_keeps_its_grade_and_gets_a_forced_pass_within_the_context(
        tmp_path, capsys, monkeypatch):
    """--n up to the context is allowed; the forced continuation of such a response asked the engine for
    prompt + response + forcing text + 32 tokens, past the context: an EngineError, the whole item retried and
    written as an error line (a correct response counted wrong)."""
    seen = _responses_that_fill_the_context(monkeypatch)
    run_file = tmp_path / "run.jsonl"
    rc = main(["eval", "--model", "tiny", "--datasets", "math500", "--methods", "greedy", "--limit", "1", "--n", "4",
               "--forced-answer", "--out", str(run_file)])
    capsys.readouterr()
    (rec,) = read_run(run_file)[1]
    assert rc == 0 and "error" not in rec
    assert seen["ctx"] == 2048  # the tiny model's context
    assert rec["prompt_tokens"] + len(rec["response_ids"]) == seen["ctx"] and rec["correct"] is True
    assert rec["forced_tokens"] == 0 and rec["forced_correct"] is True  # no room: the response's own answer


def test_on_a_server_the_forced_pass_stays_within_the_context_the_server_reports(tmp_path, capsys, monkeypatch):
    """The same on an SGLang server: its context comes from GET /v1/models (max_model_len).  Without it the forced
    pass asked for 32 tokens past the context, the server refused it (HTTP 400), and the item became an error
    line."""
    from forerun.runtime_ext.standin.server import StandInServer

    seen = _responses_that_fill_the_context(monkeypatch)
    seen["ctx"] = 3000
    run_file = tmp_path / "run.jsonl"
    with StandInServer(context_length=3000) as srv:
        rc = main(["eval", "--backend", srv.url, "--datasets", "math500", "--methods", "greedy", "--limit", "1",
                   "--n", "4", "--forced-answer", "--out", str(run_file)])
        forced_requests = srv.generate_bodies()
    capsys.readouterr()
    (rec,) = read_run(run_file)[1]
    assert rc == 0 and "error" not in rec, rec.get("error")
    assert rec["prompt_tokens"] + len(rec["response_ids"]) == 3000 and rec["correct"] is True
    assert rec["forced_tokens"] == 0 and rec["forced_correct"] is True and forced_requests == []


def test_a_server_client_reads_its_context_from_v1_models_and_none_where_the_server_does_not_say(monkeypatch):
    from forerun.runtime_ext.backends.server_client import SGLangServerClient
    from forerun.runtime_ext.backends.server_wire import SGLangServerError
    from forerun.runtime_ext.standin.server import StandInServer

    with StandInServer(context_length=777) as srv:
        assert SGLangServerClient(srv.url, tokenizer=srv.tokenizer).max_context == 777
        silent = SGLangServerClient(srv.url, tokenizer=srv.tokenizer)

        def not_found(method, path, **kw):
            raise SGLangServerError("HTTP 404", url=srv.url + path, status=404)

        monkeypatch.setattr(silent, "_request", not_found)
        assert silent.max_context is None
