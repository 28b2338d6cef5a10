"""The README's bad-input table is a test, and so is its exit-code table.

Each row of the table under "Exit codes and bad input" (input, its one line on stderr, exit code) is run in a
folder holding the files the rows name; the command must exit with the row's code and print exactly one line
on stderr that contains the row's text, and no traceback.  Most rows call `main(argv)` in this process; the
rows in REAL_PROCESS run the real `forerun` (the exit status and stderr of a whole process).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from forerun.cli.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, EXIT_USAGE

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "### Exit codes and bad input"


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n#", start + len(SECTION))
    return text[start: end if end >= 0 else None]


def _tables(section: str) -> list[list[list[str]]]:
    """Every markdown table of the section: its rows (header and separator dropped), cells stripped."""
    tables, rows = [], []
    for line in section.splitlines() + [""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            tables.append(rows[2:])
            rows = []
    return tables


def _code(cell: str) -> str:
    match = re.fullmatch(r"`(.*)`", cell)
    assert match, f"expected one `code` span, got {cell!r}"
    return match.group(1)


EXIT_TABLE, BAD_INPUT = _tables(_section())
ROWS = [(shlex.split(_code(cmd))[1:], _code(line), int(code)) for cmd, line, code in BAD_INPUT]
IDS = [" ".join(argv)[:70] for argv, _, _ in ROWS]
REAL_PROCESS = {"generate --prompt x --backend ", "classifier train --records NOT_UTF8.jsonl --out clf.json"}


def test_the_exit_code_table_is_the_one_the_code_uses():
    assert [int(row[0]) for row in EXIT_TABLE] == [EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED]
    assert {code for _, _, code in ROWS} <= {EXIT_FAILURE, EXIT_USAGE}
    assert REAL_PROCESS <= set(IDS) and len(ROWS) >= 20


@pytest.fixture
def inputs(tmp_path, monkeypatch):
    """A folder with the files the rows name; the commands run in it."""
    bad = b'{"prompt_id": "a\xff"}\n'  # 0xff at offset 16
    assert bad.index(b"\xff") == 16
    (tmp_path / "NOT_UTF8.jsonl").write_bytes(bad)
    (tmp_path / "NOT_UTF8.json").write_bytes(b"\xff{}")
    (tmp_path / "DATA").mkdir()
    (tmp_path / "DATA" / "math500.jsonl").write_bytes(bad)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("argv,line,code", ROWS, ids=IDS)
def test_every_readme_bad_input_row(argv, line, code, inputs, request, run_forerun, run_forerun_in_process,
                                   assert_one_line_error):
    real = request.node.callspec.id in REAL_PROCESS
    proc = run_forerun(argv, cwd=inputs) if real else run_forerun_in_process(argv)
    assert_one_line_error(proc, line, code)
    assert not Path("/no-such-dir").exists() and not (inputs / "run.jsonl").exists()  # nothing created
