"""Tests for `forerun classifier train|cv`."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

import pytest

from forerun.classifiers.certainty import CertaintyClassifier
from forerun.programs.records import RecordWriter
from forerun.testing.synthetic_records import synthetic_node_records
from forerun.cli import classifier as cli_classifier, main as cli


def write_node_records(path, records) -> int:
    return RecordWriter(path).write_nodes(records)


def run(argv: list[str]) -> int:
    """Parse with a parser holding only this area's commands (other areas' modules may be absent)."""
    parser = argparse.ArgumentParser(prog="forerun")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench").add_subparsers(dest="bench_command")
    cli_classifier.register(sub, bench)
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


@pytest.fixture(scope="module")
def record_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    recs = synthetic_node_records(n_prompts=10, calls_per_prompt=5, nodes_per_call=8, seed=21)
    half = len(recs) // 2
    a, b = root / "a.jsonl", root / "b.jsonl"
    write_node_records(a, recs[:half])
    write_node_records(b, recs[half:])
    return [str(a), str(b)], len(recs)


def test_module_is_registered():
    assert cli_classifier in cli.COMMAND_MODULES


def test_train_writes_model(tmp_path, record_files, capsys):
    files, n = record_files
    out = tmp_path / "model.json"
    assert run(["classifier", "train", "--records", *files, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"trained on {n} records" in text and str(out) in text
    model = CertaintyClassifier.load(out)
    assert model.training_size == n
    assert 0 < model.branch_prob_accept(0.5) < 1


def test_train_warns_about_early_rejection_bounds(tmp_path, capsys):
    """Records whose log A is only an upper bound (streaming early rejections) are named on stderr; exact ones
    are not."""
    recs = synthetic_node_records(n_prompts=4, calls_per_prompt=3, nodes_per_call=6, seed=5)
    exact, bounded = tmp_path / "exact.jsonl", tmp_path / "bounded.jsonl"
    write_node_records(exact, recs)
    write_node_records(bounded, [replace(r, extra={**r.extra, "log_accept_is_bound": True}) if i % 3 == 0 else r
                                 for i, r in enumerate(recs)])
    assert run(["classifier", "train", "--records", str(exact), "--out", str(tmp_path / "a.json"), "--json"]) == 0
    assert "upper bound" not in capsys.readouterr().err
    assert run(["classifier", "train", "--records", str(bounded), "--out", str(tmp_path / "b.json"), "--json"]) == 0
    captured = capsys.readouterr()
    assert f"{len(range(0, len(recs), 3))} of {len(recs)} records are early rejections" in captured.err
    json.loads(captured.out)  # stdout stays strict JSON


def test_train_json_and_feature_set(tmp_path, record_files, capsys):
    files, n = record_files
    out = tmp_path / "m2.json"
    assert run(["classifier", "train", "--records", *files, "--out", str(out), "--features", "1+2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["training_size"] == n
    assert data["model"]["features"] == ["cut_fraction", "parent_cut", "cut_gap", "depth", "accepts_on_path"]


def test_cv_table_and_json(record_files, capsys):
    files, n = record_files
    assert run(["classifier", "cv", "--records", *files, "--folds", "5"]) == 0
    captured = capsys.readouterr()
    assert "accuracy" in captured.out and "log loss" in captured.out and "baseline" in captured.out
    assert run(["classifier", "cv", "--records", *files, "--folds", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n_records"] == n and report["folds"] == 3 and report["grouped_by_prompt"]
    assert report["classifier"]["log_loss"] < report["baseline"]["log_loss"]
    assert report["dropped_unreachable"] == 0
    # synthetic calls hold nodes 0..7 of a heap: all ancestors present, nothing to drop
    assert run(["classifier", "cv", "--records", *files, "--folds", "3", "--json", "--drop-unreachable"]) == 0
    assert json.loads(capsys.readouterr().out)["n_records"] == n


@pytest.mark.parametrize("command", [["cv", "--folds", "3"], ["train", "--out", "{tmp}/c.json"]])
def test_a_torn_last_line_is_a_warning_not_an_error(tmp_path, capsys, command):
    """A records file whose last append was cut short (no newline) used to fail every classifier command until the
    user edited it: each reads the whole lines and says, on one stderr line, which line it skipped (ceiling:
    tests/classifiers/test_ceiling.py)."""
    recs = synthetic_node_records(n_prompts=6, calls_per_prompt=3, nodes_per_call=8, seed=5)
    path = tmp_path / "nodes.jsonl"
    n = write_node_records(path, recs)
    with path.open("a") as fh:
        fh.write('{"prompt_id": "p0", "sampler": "presto-po')
    argv = ["classifier", command[0], "--records", str(path), *(a.format(tmp=tmp_path) for a in command[1:])]
    assert run([*argv, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["n_records" if command[0] == "cv" else "training_size"] == n
    assert [line for line in err.splitlines() if line.startswith("forerun")] == [
        f"forerun classifier: warning: {path}:{n + 1}: skipped a torn line (a write cut short by a kill or a full disk)"]


def test_unreachable_records_are_dropped_by_default(tmp_path, capsys):
    """App. E.7's training data leaves out the requests BFS placed below a deferred node: the default."""
    import dataclasses

    recs = synthetic_node_records(n_prompts=6, calls_per_prompt=4, nodes_per_call=8, seed=3)
    stray = dataclasses.replace(recs[0], node_id=2 * 100 + 1, depth=6)  # parent 100: ancestors 11, 24 absent
    path = tmp_path / "r.jsonl"
    write_node_records(path, [*recs, stray])
    out = tmp_path / "m.json"
    assert run(["classifier", "train", "--records", str(path), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dropped_unreachable"] == 1
    assert run(["classifier", "train", "--records", str(path), "--out", str(out), "--json",
                "--no-drop-unreachable"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dropped_unreachable"] == 0 and data["training_size"] == len(recs) + 1


def test_errors_are_reported_not_raised(tmp_path, record_files, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_id": "x"}\n')
    assert run(["classifier", "cv", "--records", str(bad)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
    files, _ = record_files
    assert run(["classifier", "cv", "--records", files[0], "--folds", "50"]) == 2
    assert "distinct prompt_id" in capsys.readouterr().err
    two = tmp_path / "two.jsonl"
    write_node_records(two, synthetic_node_records(n_prompts=4, seed=2, classes=("reject", "accept")))
    assert run(["classifier", "train", "--records", str(two), "--out", str(tmp_path / "x.json")]) == 2
    assert "allow-missing-classes" in capsys.readouterr().err
    assert run(["classifier", "train", "--records", str(two), "--out", str(tmp_path / "x.json"), "--allow-missing-classes"]) == 0


def test_sampler_filter(tmp_path, capsys):
    from forerun.programs.records import NodeRecord
    import dataclasses

    recs = synthetic_node_records(n_prompts=6, calls_per_prompt=4, nodes_per_call=8, seed=9)
    tagged = [
        dataclasses.replace(r, sampler="presto-power-mh" if i % 2 else "presto-entropy-cut")
        for i, r in enumerate(recs)
    ]
    assert isinstance(tagged[0], NodeRecord)
    path = tmp_path / "mixed.jsonl"
    write_node_records(path, tagged)
    out = tmp_path / "m.json"
    assert run(["classifier", "train", "--records", str(path), "--out", str(out), "--sampler", "presto-power-mh", "--json",
                "--no-drop-unreachable"]) == 0
    assert json.loads(capsys.readouterr().out)["training_size"] == len(recs) // 2
    assert run(["classifier", "train", "--records", str(path), "--out", str(out), "--sampler", "nope"]) == 2
    assert "samplers found: presto-entropy-cut, presto-power-mh" in capsys.readouterr().err
    unnamed = tmp_path / "unnamed.jsonl"
    write_node_records(unnamed, [dataclasses.replace(r, sampler=None) for r in recs[:8]])
    assert run(["classifier", "train", "--records", str(unnamed), "--out", str(out), "--sampler", "nope"]) == 2
    assert "(samplers found: none (and records with no sampler))" in capsys.readouterr().err  # was "None"


def test_a_node_recorded_twice_counts_once(record_files, capsys):
    """The same records twice (a file passed twice; bfs and predictive scoring one round's node) give the fit and
    the cross-validation of the records once: no node weighs double, no test node has its copy in training."""
    files, n = record_files
    assert run(["classifier", "cv", "--records", *files, "--folds", "3", "--no-group", "--json"]) == 0
    once = json.loads(capsys.readouterr().out)
    assert run(["classifier", "cv", "--records", *files, *files, "--folds", "3", "--no-group", "--json"]) == 0
    twice = json.loads(capsys.readouterr().out)
    assert twice["n_records"] == once["n_records"] == n and twice["dropped_duplicates"] == n
    assert twice["classifier"] == once["classifier"]


def test_a_library_warning_during_cv_is_one_warning_line(tmp_path, run_forerun):
    """Was: scikit-learn's UserWarning on stderr as Python prints it, two raw lines (its file and line number, then
    `warnings.warn(`). A class with 2 records and 3 folds makes StratifiedKFold warn; the report still comes."""
    recs = synthetic_node_records(n_prompts=3, calls_per_prompt=2, nodes_per_call=2, seed=1)
    assert sorted(r.certainty_class for r in recs).count("reject") == 2
    path = tmp_path / "nodes.jsonl"
    write_node_records(path, recs)
    proc = run_forerun(["classifier", "cv", "--records", str(path), "--folds", "3", "--no-group", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["n_records"] == len(recs)
    assert proc.stderr.splitlines() == ["forerun classifier: warning: The least populated class in y has only 2 "
                                        "members, which is less than n_splits=3."], proc.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full (a device whose every write fails ENOSPC)")
def test_a_full_disk_under_train_out_names_the_file(record_files, run_forerun, assert_one_line_error):
    """Was: 'forerun classifier train: [Errno 28] No space left on device', naming no file."""
    files, _ = record_files
    proc = run_forerun(["classifier", "train", "--records", *files, "--out", "/dev/full"])
    assert_one_line_error(proc, "forerun classifier train: --out /dev/full: the classifier was not written whole "
                                "(No space left on device)", code=1)
