"""scripts/kernel_ab: paired timing of two kernel builds in one process (a developer's benchmark; its numbers are not
tested, only that it compares what it says and refuses bad input)."""

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "kernel_ab"


def _script_module():
    loader = importlib.machinery.SourceFileLoader("kernel_ab_script", str(SCRIPT))
    spec = importlib.util.spec_from_loader("kernel_ab_script", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_every_pybind11_class_of_the_kernels_becomes_module_local_once():
    source = (REPO / "runtime_ext/engine/csrc/forerun_kernels.cpp").read_text()
    classes = source.count("pybind11::class_<")
    assert classes >= 2
    local = _script_module().module_local(source)
    assert local.count("pybind11::module_local()") == classes
    assert _script_module().module_local(local) == local


@pytest.mark.parametrize("args,message", [
    ([], "give --base REV or two kernel sources"),
    (["--base", "HEAD", "a.cpp", "b.cpp"], "give --base REV or two kernel sources"),
    (["--base", "no-such-revision"], "no kernels at revision"),
    (["nowhere-a.cpp", "nowhere-b.cpp"], "no such file: nowhere-a.cpp, nowhere-b.cpp"),
    (["--base", "HEAD", "--rows", "0"], "--rows between 1 and 256"),
    (["--base", "HEAD", "--step", "--tokens", "0"], "--tokens between 1 and 1024"),
    (["--base", "HEAD", "--step", "--hot"], "--hot is for the attention alone, not --step"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_build(args, message):
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and message in done.stderr
    assert "building" not in done.stderr


@pytest.mark.slow
def test_two_builds_are_timed_side_by_side_and_agree_bit_for_bit():
    done = subprocess.run([sys.executable, str(SCRIPT), "--base", "HEAD", "--rows", "2", "--repeats", "2", "--hot",
                           "--json"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["hot"] is True
    [row] = out["attention"]
    assert row["rows"] == 2 and row["pairs"] == 2 and 0 <= row["b_faster_pairs"] <= 2
    assert row["a_median_ms"] > 0 and row["b_median_ms"] > 0


@pytest.mark.slow
def test_step_mode_times_whole_decode_steps_of_both_builds():
    done = subprocess.run([sys.executable, str(SCRIPT), "--base", "HEAD", "--step", "--rows", "2", "--repeats", "2",
                           "--tokens", "4", "--json"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)["step"]
    assert row["rows"] == 2 and row["pairs"] == 2 and row["a_median_ms"] > 0 and row["b_median_ms"] > 0


@pytest.mark.slow
def test_step_mode_fails_when_the_builds_decode_different_tokens(tmp_path):
    source = (REPO / "runtime_ext/engine/csrc/forerun_kernels.cpp").read_text()
    norm = "A inv = A(1) / std::sqrt(var + A(eps));"  # rmsnorm: B negates every normed activation
    assert source.count(norm) == 1
    (tmp_path / "a.cpp").write_text(source)
    (tmp_path / "b.cpp").write_text(source.replace(norm, "A inv = A(-1) / std::sqrt(var + A(eps));"))
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "a.cpp"), str(tmp_path / "b.cpp"), "--step",
                           "--rows", "1", "--repeats", "1", "--tokens", "8"], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode != 0 and "the builds' tokens differ at 1 rows" in done.stderr
