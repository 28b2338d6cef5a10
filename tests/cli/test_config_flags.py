"""cli/config_flags.py: a frozen config's validation error reaches the user naming the flag typed (`--block`), not
the dataclass field (`block_size`), in every command that builds a config from its flags."""

from __future__ import annotations

import pytest

from forerun.cli.config_flags import name_flags


def test_field_names_become_flags_as_whole_words_only():
    flags = {"n": "--n", "block_size": "--block", "tau": "--tau"}
    text = "block_size B must divide n=3; --n, x.n, n_max, tau_p and block_sizes stay; tau = 'auto'"
    assert name_flags(text, flags) == "--block B must divide --n=3; --n, x.n, n_max, tau_p and block_sizes stay; --tau = 'auto'"
    assert name_flags(text, {}) == text


@pytest.mark.parametrize("argv, flag_message, fields", [
    (["sample", "--model", "tiny", "--prompt", "hi", "--n", "10", "--block", "3"],
     "--block B must divide --n n=10, got 3", ("block_size", "response_length")),
    (["bench", "presto", "--model", "tiny", "--prompts", "1", "--n", "10", "--block", "3"],
     "--block B must divide --n n=10, got 3", ("block_size", "response_length")),
    (["bench", "preposition", "--model", "tiny", "--calib-windows", "1"],
     "--calib-windows must be 0 (skip) or >= 2", ("calib_windows",)),
    (["bench", "preposition", "--model", "tiny", "--trace-interval", "1e9"],
     "--trace-interval: a mean update interval of 1e+09 s is over 3600 s", ("trace_interval_s",)),
    (["bench", "preposition", "--model", "tiny", "--tau", "auto", "--status-windows", "0"],
     'needs the status calibration (--status-windows > 0)', ("status_windows",)),
    (["eval", "--model", "tiny", "--datasets", "math500", "--methods", "power-mh", "--n", "10", "--block", "3",
      "--out", "{tmp}/run.jsonl"], "--block B must divide --n=10, got 3", ()),
    (["bench", "engine", "--model", "tiny", "--root-tokens", "5", "--suffixes", "20"],
     "--root-tokens (5) too small for 21 distinct cuts", ("root_tokens",)),
    (["bench", "work-split", "--model", "tiny", "--neighbour-duty", "1"],
     "--neighbour-duty must be in [0, 1), got [1.0]", ("neighbour_duties", "neighbour duties")),
    (["generate", "--model", "tiny", "--prompt", "x", "--top-p", "2"], "--top-p must be in (0, 1], got 2.0", ("top_p",)),
    (["generate", "--model", "tiny", "--prompt", "x", "--max-tokens", "2", "--top-k", "-5"],
     "--top-k must be -1 (off) or >= 1, got -5", ("top_k",)),
    (["classifier", "cv", "--records", "{tmp}/records.jsonl", "--l2-penalty", "-1"],
     "--l2-penalty must be a positive finite number, got -1.0", ("l2_penalty",)),
])
def test_a_config_error_names_the_flag_typed(tmp_path, run_forerun_in_process, assert_one_line_error, argv,
                                             flag_message, fields):
    from forerun.programs.records import RecordWriter
    from forerun.testing.synthetic_records import synthetic_node_records

    RecordWriter(tmp_path / "records.jsonl").write_nodes(synthetic_node_records(n_prompts=3, seed=1))
    proc = run_forerun_in_process([a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert_one_line_error(proc, flag_message, code=2)
    assert not any(field in proc.stderr for field in fields), proc.stderr
    assert not (tmp_path / "run.jsonl").exists()
