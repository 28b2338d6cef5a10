"""The GPU install resolves: SGLang 0.5.23 with its pinned CUDA torch and forerun (with its test extra) in one
environment, as `FORERUN_GPU=1 scripts/setup` installs them, with no conflict (pip's resolver, --dry-run: nothing
is installed).  Needs the package index: `scripts/test -m network`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SGLANG = "sglang==0.5.23"
TORCH = "torch==2.14.1"  # what sglang 0.5.23 pins (Requires-Dist: torch==2.14.1)


@pytest.mark.network
def test_the_gpu_install_resolves_with_no_conflict(tmp_path):
    report = tmp_path / "report.json"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                          "--report", str(report), SGLANG, TORCH, "-e", f"{REPO}[test]"],
                         capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "conflict" not in res.stderr.lower() and "ResolutionImpossible" not in res.stderr
    chosen = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    assert chosen["sglang"] == "0.5.23" and chosen["torch"].startswith("2.14.1")
    assert "triton" in chosen and "orjson" in chosen  # the runtime, not the frontend alone
    assert "forerun" in chosen and "smg" in chosen
