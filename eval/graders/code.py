"""Code grading: the response's program run against the dataset's tests in the sandbox (`eval.sandbox`).

    dataset     program run in the sandbox                                      passes when
    humaneval   solution (the prompt's stub prepended when the solution lacks    it runs to the end
                the entry point) + the dataset's `check` + check(entry_point)
    mbpp        solution + test_setup_code + the test_list asserts              it runs to the end
    lcb-v5/v6   stdin tests: the solution with the test's input on stdin        stdout matches (per line, tokens;
                                                                                floats within 1e-6), every test
                functional tests: the solution + a call of Solution().<name>    the JSON result equals, every test
                with the JSON-decoded arguments (one per input line)

The solution is the last ```python fenced block (an unclosed final fence counts: responses can be cut at
n tokens), else the whole response.  LiveCodeBench's offline copy has no reference solutions; its grader
is tested on hand-written solutions of two problems.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .sandbox import SandboxLimits, SandboxResult, run_sandboxed

LIMITS = SandboxLimits(cpu_s=10, wall_s=20)
LCB_LIMITS = SandboxLimits(cpu_s=6, wall_s=12)
LCB_PREAMBLE = ("from typing import *\nfrom collections import *\nfrom itertools import *\nfrom functools import *\n"
                "from heapq import *\nfrom bisect import *\nimport math, sys, re, string, collections, heapq, bisect, "
                "itertools, functools\n")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(response: str) -> str:
    """The last fenced code block (python or unlabeled preferred), else the whole response."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(response)]
    for lang, body in reversed(blocks):
        if lang in ("python", "py", "python3", "") and body.strip():
            return body
    return blocks[-1][1] if blocks else response


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None


def humaneval_program(solution: str, extra: dict[str, Any]) -> str:
    entry = extra["entry_point"]
    code = solution if _defines(solution, entry) else extra["prompt"] + solution
    return f"{code}\n\n{extra['test']}\n\ncheck({entry})\n"


def mbpp_program(solution: str, extra: dict[str, Any]) -> str:
    tests = "\n".join(extra["test_list"])
    return f"{solution}\n\n{extra.get('test_setup_code') or ''}\n{tests}\n"


def _functional_program(solution: str, func: str, test: dict[str, Any]) -> str:
    args = [json.loads(line) for line in test["input"].split("\n") if line.strip()]
    return (f"{LCB_PREAMBLE}\n{solution}\n\nimport json as _json\n"
            f"_got = Solution().{func}(*_json.loads({json.dumps(json.dumps(args))}))\n"
            f"_want = _json.loads({json.dumps(test['output'])})\n"
            f"assert _json.loads(_json.dumps(_got)) == _want, f'got {{_got!r}}, expected {{_want!r}}'\n")


def _same_tokens(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))
    except ValueError:
        return False


def stdout_matches(got: str, want: str) -> bool:
    """Line by line after stripping trailing blanks; tokens equal, or floats within 1e-6 (relative)."""
    g = [ln.split() for ln in got.strip().splitlines()]
    w = [ln.split() for ln in want.strip().splitlines()]
    return len(g) == len(w) and all(len(x) == len(y) and all(map(_same_tokens, x, y)) for x, y in zip(g, w))


def _lcb_one(solution: str, test: dict[str, Any], func: str | None) -> tuple[bool, SandboxResult]:
    if test.get("testtype") == "functional":
        if not func:
            raise ValueError("functional LiveCodeBench test without a function name in the starter code")
        res = run_sandboxed(_functional_program(solution, func, test), limits=LCB_LIMITS)
        return res.completed, res
    res = run_sandboxed(LCB_PREAMBLE + solution, stdin=test["input"], limits=LCB_LIMITS)
    return res.completed and stdout_matches(res.stdout, test["output"]), res


def _why(res: SandboxResult) -> str:
    if res.killed_for:
        return res.killed_for
    tail = res.stderr.strip().splitlines()[-1:] if res.stderr.strip() else []
    return tail[0][:200] if tail else f"exit {res.exit_code}"


def grade_code(response: str, dataset: str, extra: dict[str, Any], *, extracted: bool = False
               ) -> tuple[bool, str | None, str]:
    """(passed, the program graded, detail) of a code response; `extracted=True`: `response` is the code."""
    solution = response if extracted else extract_code(response)
    if not solution.strip():
        return False, solution, "no code"
    if dataset == "humaneval":
        res = run_sandboxed(humaneval_program(solution, extra), limits=LIMITS)
        return res.completed, solution, "passed" if res.completed else _why(res)
    if dataset == "mbpp":
        res = run_sandboxed(mbpp_program(solution, extra), limits=LIMITS)
        return res.completed, solution, "passed" if res.completed else _why(res)
    tests = extra.get("tests") or []
    if not tests:
        return False, solution, "no tests"
    for i, test in enumerate(tests):
        ok, res = _lcb_one(solution, test, extra.get("func_name"))
        if not ok:
            return False, solution, f"test {i + 1}/{len(tests)} failed: {_why(res) if not res.completed else 'wrong output'}"
    return True, solution, f"passed {len(tests)} tests"
