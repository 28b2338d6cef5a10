"""The run file: strict JSON lines, one write per line, torn-tail repair, ordering of the work."""

from __future__ import annotations

import json
import math

import pytest

from forerun.eval.harness.runs import (
    RunFileError,
    RunWriter,
    WorkItem,
    encode_line,
    item_key,
    final_records,
    header_differences,
    load_run,
    read_run,
    run_header,
    plan_items,
    run_items,
    strict_json,
)


class _P:
    def __init__(self, pid):
        self.id = pid


def test_strict_json_and_one_line_per_record():
    import numpy as np

    rec = {"key": "k", "x": math.nan, "y": [1.0, math.inf, (2, np.float64(3.5))], "z": np.int64(4)}
    line = encode_line(rec)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    back = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict constant {c}"))
    assert back == {"key": "k", "x": None, "y": [1.0, None, [2, 3.5]], "z": 4}
    assert strict_json({"a": "text\nwith newline"}) == {"a": "text\nwith newline"}
    assert encode_line({"key": "k", "a": "line\nbreak"}).count(b"\n") == 1


def test_writer_appends_and_load_repairs_a_torn_tail(tmp_path):
    path = tmp_path / "run.jsonl"
    with RunWriter(path) as w:
        w.write({"key": "a", "v": 1})
        w.write({"key": "b", "v": 2})
    with open(path, "ab") as fh:
        fh.write(b'{"key": "c", "v"')  # a kill in the middle of a write
    assert [r["key"] for r in load_run(path, repair=False)] == ["a", "b"]
    assert path.read_bytes().endswith(b'"v"')  # repair=False leaves the file alone
    assert [r["key"] for r in load_run(path)] == ["a", "b"]
    assert path.read_bytes().endswith(b"}\n")
    with RunWriter(path) as w:
        w.write({"key": "c", "v": 3})
    assert [r["key"] for r in load_run(path)] == ["a", "b", "c"]


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path):
    """A file saved without its final newline (edited by hand) ends in a whole record: it was truncated away as a
    torn line by --resume (a finished result deleted, and the item run again) and left out of `eval report`
    without a word.  It is read as a record, the file is not changed by reading it, and the next record written
    goes on a line of its own."""
    path = tmp_path / "run.jsonl"
    head = run_header({"n": 32}, "m", "float32", 1)
    text = json.dumps(head) + "\n" + '{"key": "a", "v": 1}\n' + '{"key": "b", "v": 2}'
    path.write_text(text)
    assert read_run(path, repair=False) == (head, [{"key": "a", "v": 1}, {"key": "b", "v": 2}])
    assert read_run(path) == (head, [{"key": "a", "v": 1}, {"key": "b", "v": 2}]) and path.read_text() == text
    with RunWriter(path) as w:
        w.write({"key": "c", "v": 3})
        w.write({"key": "d", "v": 4})
    assert path.read_text() == text + '\n{"key": "c", "v": 3}\n{"key": "d", "v": 4}\n'
    assert [r["key"] for r in load_run(path)] == ["a", "b", "c", "d"]


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failed_write_names_the_run_file():
    """A failed write (a full disk: /dev/full fails every write) is an OSError naming the run file; the CLI's
    one line then says which file, and the errno keeps it a failure (exit 1), not a usage error."""
    import errno

    with RunWriter("/dev/full") as w, pytest.raises(OSError) as caught:
        w.write({"key": "a", "v": 1})
    assert caught.value.errno == errno.ENOSPC and "/dev/full" in str(caught.value)


def test_corrupt_complete_line_is_an_error(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text('{"key": "a"}\nnot json\n{"key": "b"}\n')
    with pytest.raises(RunFileError, match=":2:"):
        load_run(path)
    path.write_text('{"no_key": 1}\n')
    with pytest.raises(RunFileError, match="not a forerun run file"):
        load_run(path)


def test_a_file_that_is_not_a_run_is_refused_untouched(tmp_path):
    path = tmp_path / "notes.txt"
    data = b"line one\nline two without a newline"
    path.write_bytes(data)
    with pytest.raises(RunFileError, match="not a forerun run file"):
        read_run(path)
    assert path.read_bytes() == data  # not truncated
    path.write_bytes(b'{"a": 1}')  # one unterminated JSON line
    with pytest.raises(RunFileError):
        read_run(path)
    assert path.read_bytes() == b'{"a": 1}'


def test_a_torn_header_is_a_run_that_never_started(tmp_path):
    """A kill while the header was written leaves one unterminated line that begins like a header: `eval` without
    --resume says the file holds a run and to pass --resume, so --resume must take it (truncated to empty: no item
    ran), not refuse it as 'not a forerun run file'.  Other unterminated lines stay refused, untouched."""
    path = tmp_path / "run.jsonl"
    full = encode_line(run_header({"n": 32}, "m", "float32", 1))
    for cut in (5, 16, len(full) // 2, len(full) - 1):
        path.write_bytes(full[:cut])
        assert read_run(path, repair=False) == (None, []) and path.read_bytes() == full[:cut]
        assert read_run(path) == (None, []) and path.read_bytes() == b"", cut
    for junk in (b'{"', b'{"key": "a", "v', b'{"forerun_runs": 1, "x'):
        path.write_bytes(junk)
        with pytest.raises(RunFileError, match="one unterminated line"):
            read_run(path)
        assert path.read_bytes() == junk


def test_header_first_and_the_last_line_of_a_key_wins(tmp_path):
    path = tmp_path / "run.jsonl"
    head = run_header({"n": 32, "alpha": 4.0}, "m", "float32", 1)
    with RunWriter(path) as w:
        w.write(head)
        w.write({"key": "a", "error": "boom"})
        w.write({"key": "b", "correct": True})
        w.write({"key": "a", "correct": False})
    got_head, recs = read_run(path)
    assert got_head == head and [r["key"] for r in recs] == ["a", "b", "a"]
    assert [(r["key"], r.get("error")) for r in final_records(recs)] == [("a", None), ("b", None)]
    other = run_header({"n": 32, "alpha": 2.0}, "m", "float32", 2)
    assert header_differences(head, other) == ["concurrency (1 -> 2)", "alpha (4.0 -> 2.0)"]
    assert header_differences(head, head) == []


def test_plan_order_and_keys():
    items = plan_items({"d1": [_P("p0"), _P("p1")], "d2": [_P("q0")]}, ["m1", "m2"], [1, 2])
    assert [i.key for i in items[:4]] == [item_key("d1", "m1", "p0", 1), item_key("d1", "m1", "p0", 2),
                                           item_key("d1", "m1", "p1", 1), item_key("d1", "m1", "p1", 2)]
    assert len(items) == 12 and len({i.key for i in items}) == 12


def test_run_items_writes_every_item_once_with_concurrency(tmp_path):
    items = plan_items({"d": [_P(f"p{i}") for i in range(7)]}, ["m"], [0])
    path = tmp_path / "run.jsonl"
    with RunWriter(path) as w:
        n = run_items(items, lambda it: {"v": it.prompt.id}, lambda it, out: {"key": it.key, **out}, w, concurrency=3)
    recs = load_run(path)
    assert n == 7 and sorted(r["key"] for r in recs) == sorted(i.key for i in items)


def test_run_items_stops_on_an_exception_keeping_what_was_written(tmp_path):
    items = plan_items({"d": [_P(f"p{i}") for i in range(5)]}, ["m"], [0])

    def gen(it: WorkItem):
        if it.prompt.id == "p3":
            raise KeyboardInterrupt
        return {}

    path = tmp_path / "run.jsonl"
    with RunWriter(path) as w, pytest.raises(KeyboardInterrupt):
        run_items(items, gen, lambda it, out: {"key": it.key}, w, concurrency=1)
    assert [r["key"].split("|")[2] for r in load_run(path)] == ["p0", "p1", "p2"]
