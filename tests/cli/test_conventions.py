"""Conventions every `forerun` command follows: no abbreviated options, `--quiet` on every command, and
`--quiet` / `--json` leave stderr free of progress bars."""

from __future__ import annotations

import json
import os

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


def test_quiet_silences_the_model_loaders_bars_too_and_restores_them(monkeypatch):
    """transformers' "Loading weights" bar is not forerun's: --quiet / --json switch it off through the variable
    huggingface_hub defines (read when transformers is imported) and directly when transformers already is."""
    from transformers.utils import logging

    from forerun.cli.output import quiet_bars

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    logging.enable_progress_bar()
    with quiet_bars(True):
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and not logging.is_progress_bar_enabled()
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ and logging.is_progress_bar_enabled()
    with quiet_bars(False):
        assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ and logging.is_progress_bar_enabled()
