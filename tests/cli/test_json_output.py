"""Every `--json` output is strict JSON: it parses with NaN and ±Infinity rejected, and an undefined value is
null with its reason under "undefined".  Tiny model, small sizes; the cases in REAL_PROCESS run the real
entry point in a subprocess (stdout is then the whole process's), the others `main(argv)` in the test
process with stdout captured at its file descriptor (tests/cli/conftest.py)."""

from __future__ import annotations

import functools
import json

import pytest

from forerun.eval.engine_bench import bench as engine_bench
from forerun.programs.records import RecordWriter
from forerun.runtime_ext.standin.server import StandInServer
from forerun.testing.synthetic_records import synthetic_node_records


def write_node_records(path, records) -> int:
    return RecordWriter(path).write_nodes(records)


def _reject(constant: str):
    raise ValueError(f"not JSON: {constant}")


def strict_loads(text: str):
    return json.loads(text, parse_constant=_reject)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("json_output")
    path = root / "records.jsonl"
    write_node_records(path, synthetic_node_records(n_prompts=4, seed=3))
    return root, path


TINY = ["--model", "tiny"]
CASES = {
    "generate": ["generate", "--prompt", "hi", "--max-tokens", "3", "--seed", "1", *TINY],
    "generate greedy": ["generate", "--prompt", "hi", "--max-tokens", "3", "--temperature", "0", *TINY],
    "sample": ["sample", "--prompt", "hi", "--n", "4", "--K", "3", "--presto", "--npf", "4", *TINY],
    "sample multitry": ["sample", "--prompt", "hi", "--n", "4", "--K", "2", "--sampler", "multitry-mh", *TINY],
    "bench presto": ["bench", "presto", "--prompts", "1", "--n", "4", "--K", "2", "--npf", "4", *TINY],
    "bench engine": ["bench", "engine", "--root-tokens", "48", "--suffixes", "4", "--suffix-tokens", "4",
                     "--decode-tokens", "4", "--repeats", "1", *TINY],
    "bench preposition": ["bench", "preposition", "--requests", "2", "--trace-updates", "2", "--rhos", "1",
                          "--calib-windows", "2", "--status-windows", "4", "--agentic-turns", "4",
                          "--energy-iterations", "2", "--trace-interval", "0.01", *TINY],
    "session demo": ["session", "demo", *TINY],
    "session demo tau inf": ["session", "demo", "--tau", "inf", *TINY],
    "calibrate gate": ["calibrate", "gate", "--windows", "3", *TINY],
    "calibrate gate nothing accepted": ["calibrate", "gate", "--windows", "2", "--tau", "1e9", *TINY],
    "calibrate gate no tau qualifies": ["calibrate", "gate", "--windows", "2", "--r-max", "0", *TINY],
    "calibrate gate status no tau qualifies": ["calibrate", "gate", "--task", "status", "--windows", "2",
                                               "--r-max", "0", *TINY],
    "eval": ["eval", "--datasets", "math500", "--limit", "2", "--methods", "greedy,power-mh", "--n", "4", "--K", "1",
             "--out", "{root}/eval.jsonl", *TINY],
    "classifier train": ["classifier", "train", "--records", "{records}", "--out", "{root}/clf.json",
                         "--allow-missing-classes"],
    "classifier cv": ["classifier", "cv", "--records", "{records}", "--folds", "2"],
    "classifier train two features": ["classifier", "train", "--records", "{records}", "--out", "{root}/clf2.json",
                                      "--allow-missing-classes", "--features", "cut_fraction,depth"],
}

REAL_PROCESS = {"generate", "classifier cv"}
"""A command that loads a model (torch, transformers, the engine's worker thread) and one without a model."""


@pytest.mark.parametrize("name", list(CASES))
def test_json_output_is_strict(name, records, run_forerun, run_forerun_in_process, monkeypatch):
    root, path = records
    run = run_forerun if name in REAL_PROCESS else run_forerun_in_process
    if name == "bench engine":  # the same JSON from a small bandwidth probe (512 MiB re-read until stable: ~20 s)
        monkeypatch.setattr(engine_bench, "RooflineConfig",
                            functools.partial(engine_bench.RooflineConfig, bandwidth_mib=8, attempts=1))
    proc = run([a.format(root=root, records=path) for a in CASES[name]] + ["--json"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "NaN" not in proc.stdout and "Infinity" not in proc.stdout
    out = strict_loads(proc.stdout)
    assert isinstance(out, dict)
    if name == "session demo tau inf":
        assert out["tau"] is None and "never fires" in out["undefined"]["tau"]
    if name == "calibrate gate nothing accepted":
        assert out["report"]["at_tau"]["false_accept"] is None
        assert "r(τ) is undefined" in out["undefined"]["report.at_tau.false_accept"]
    # were: calibration.calibrated null with no reason when no τ qualified, and classifier train's
    # branch_prob_accept_at null with no reason for a model of more features than c/T
    if name == "eval":  # both methods 0 of 2 right: the paired bootstrap has no spread; no forced pass was run
        assert out["comparisons"][0]["diff_ci95"] == [None, None]
        assert "no spread" in out["undefined"]["comparisons[0].diff_ci95[0]"]
        assert "--forced-answer" in out["undefined"]["cells[0].forced_tokens"]
        assert out["forced_answer"] is False  # which is why the cells' other forced_* fields are null
    if name.startswith(("calibrate gate", "classifier")):
        assert not [path for path in _null_paths(out) if path not in out.get("undefined", {})], out.get("undefined")
    if name.endswith("no tau qualifies"):  # r_max = 0: only a τ whose accepted points are all right would qualify
        calibration = out["report"]["calibration"] if "report" in out else out["exact"]
        assert calibration["calibrated"] is None or calibration["calibrated"]["wrong"] == 0


def _null_paths(value, path=""):
    """The paths of every null in `value`, spelled as the "undefined" keys spell them (a.b[0].c)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _null_paths(v, f"{path}.{k}" if path else k)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _null_paths(v, f"{path}[{i}]")]
    return [path] if value is None else []


def test_sample_on_a_stock_server_reports_the_undefined_confidence_with_its_reason(run_forerun_in_process):
    """A stock SGLang server reports no entropy of p0: Eq. 22's confidence is NaN -> null + reason."""
    with StandInServer() as srv:
        proc = run_forerun_in_process(["sample", "--backend", srv.url, "--prompt", "hi", "--n", "4", "--K", "2", "--json"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = strict_loads(proc.stdout)
    assert out["confidence"] is None and "entropy" in out["undefined"]["confidence"]
