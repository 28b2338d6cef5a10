"""cli/output.py: strict JSON (NaN -> null + reason) and output paths checked before any work."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from forerun.cli.errors import CommandError
from forerun.cli.output import dumps_strict, make_output_dir, output_dir, output_file


def _reject(constant):
    raise ValueError(constant)


def test_non_finite_values_become_null_with_their_reason():
    obj = {"confidence": math.nan, "rows": [{"speedup": math.inf}, {"speedup": 1.5}],
           "arr": np.array([1.0, np.nan]), "n": np.int64(3), "ok": 0.5}
    out = json.loads(dumps_strict(obj), parse_constant=_reject)
    assert out["confidence"] is None and out["rows"][0]["speedup"] is None and out["arr"] == [1.0, None]
    assert out["n"] == 3 and out["ok"] == 0.5 and out["rows"][1]["speedup"] == 1.5
    assert "entropy" in out["undefined"]["confidence"]  # the known reason of this field
    assert set(out["undefined"]) == {"confidence", "rows[0].speedup", "arr[1]"}
    assert "inf" in out["undefined"]["rows[0].speedup"]


def test_reasons_can_be_given_and_finite_output_has_no_undefined_key():
    out = json.loads(dumps_strict({"tau": math.inf}, reasons={"tau": "never fires"}))
    assert out == {"tau": None, "undefined": {"tau": "never fires"}}
    assert "undefined" not in json.loads(dumps_strict({"a": [1, 2.0, "x", None]}))
    assert json.loads(dumps_strict([math.nan])) == {"value": [None], "undefined": {"[0]": "undefined (not a number)"}}


def test_output_file_checks(tmp_path):
    assert output_file(None, "--records") is None
    assert output_file(tmp_path / "new.jsonl", "--records") == tmp_path / "new.jsonl"
    assert not (tmp_path / "new.jsonl").exists()  # the probe leaves nothing behind
    existing = tmp_path / "old.jsonl"
    existing.write_text('{"a": 1}\n')
    assert output_file(existing, "--records") == existing and existing.read_text() == '{"a": 1}\n'
    with pytest.raises(CommandError, match="is a directory"):
        output_file(tmp_path, "--records")
    with pytest.raises(CommandError, match="does not exist"):
        output_file(tmp_path / "missing" / "x.jsonl", "--records")
    assert not (tmp_path / "missing").exists()
    with pytest.raises(CommandError, match="expected a file ending in .png"):
        output_file(tmp_path / "fig.txt", "--plot", suffixes=(".png",))
    with pytest.raises(CommandError, match="must not be empty"):
        output_file("", "--out")


def test_output_dir_checks(tmp_path):
    target = output_dir(tmp_path / "figs", "--plots")
    assert target == tmp_path / "figs" and not target.exists()  # created only when the figures are written
    assert make_output_dir(target).is_dir()
    assert output_dir(target, "--plots") == target
    (tmp_path / "file").write_text("x")
    with pytest.raises(CommandError, match="is not a directory"):
        output_dir(tmp_path / "file", "--plots")
    with pytest.raises(CommandError, match="does not exist"):
        output_dir(tmp_path / "a" / "b", "--plots")
    assert not (tmp_path / "a").exists()


def test_output_dir_checks_the_files_it_will_receive(tmp_path):
    """A FIFO or a folder where a command writes one of its files was found only when the file was written, after
    all the work (a FIFO blocked the writer); each file a directory will receive is checked with the directory."""
    import os

    os.mkfifo(tmp_path / "a.png")
    (tmp_path / "b.png").mkdir()
    (tmp_path / "c.png").write_text("x")
    with pytest.raises(CommandError, match="a.png is a FIFO, not a regular file; the benchmark writes a file there"):
        output_dir(tmp_path, "--plots", files=["c.png", "a.png"], writer="the benchmark")
    with pytest.raises(CommandError, match="b.png is a directory; the command writes a file there"):
        output_dir(tmp_path, "--plots", files=["b.png"])
    with pytest.raises(CommandError, match="is also the RUN.jsonl input"):
        output_dir(tmp_path, "--out", files=["c.png"], inputs={"RUN.jsonl": tmp_path / "c.png"})
    assert output_dir(tmp_path, "--plots", files=["c.png", "new.png"]) == tmp_path
    assert (tmp_path / "c.png").read_text() == "x" and not (tmp_path / "new.png").exists()
    assert output_dir(tmp_path / "later", "--plots", files=["a.png"]) == tmp_path / "later"  # created when written
