"""Conventions every `forerun` command follows: no abbreviated options, `--quiet` on every command, and
`--quiet` / `--json` leave stderr free of progress bars."""

from __future__ import annotations

import json

import pytest

from forerun.cli.main import _leaf_parsers, build_parser, main


def test_every_command_takes_quiet_and_no_option_is_abbreviated():
    leaves = _leaf_parsers(build_parser())
    assert len(leaves) >= 10
    assert all(any("--quiet" in a.option_strings for a in p._actions) for p in leaves)
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["bench", "presto", "--budget", "node"])  # --budget-unit, abbreviated
    assert e.value.code == 2


@pytest.mark.parametrize("flag", ["--quiet", "--json"])
def test_quiet_and_json_print_no_progress_bar(flag, capfd):
    argv = ["sample", "--model", "tiny", "--prompt", "hi", "--n", "4", "--K", "2", flag]
    assert main(argv) == 0
    out, err = capfd.readouterr()
    assert "transition" not in err and "\r" not in err  # tqdm's frames
    if flag == "--json":
        json.loads(out)
    assert main(argv[:-1]) == 0  # without: the bar is back (the setting does not leak past the command)
    assert "transition" in capfd.readouterr().err
