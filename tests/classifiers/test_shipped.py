"""The shipped certainty classifier (classifiers/shipped.py): it loads, validates and records its training."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from forerun.classifiers.certainty import MODEL_FORMAT, CertaintyClassifier
from forerun.classifiers.shipped import SHIPPED_FILE, load_shipped, mismatch_note, shipped_text

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_classifier_loads_and_validates():
    shipped = load_shipped()
    clf = shipped.classifier
    assert clf.kind == "logistic_regression" and clf.features == ("cut_fraction",)
    assert clf.training_size == shipped.training["training_records"] >= 200
    assert shipped.model == "SmolLM2-135M-Instruct" and shipped.samplers == ("power-mh",)
    h = clf.branch_prob_accept_many([0.0, 0.5, 1.0])
    assert all(0.0 < x < 1.0 for x in h)
    # the same numbers through the generic loader (an extra "training" block is ignored there)
    again = CertaintyClassifier.from_dict(json.loads(shipped_text()))
    assert list(again.branch_prob_accept_many([0.0, 0.5, 1.0])) == list(h)


def test_the_training_block_records_how_to_regenerate_it():
    training = load_shipped().training
    assert training["settings"] == {"n": 32, "block": 32, "K": 10, "npf": 20, "alpha": 4.0, "seed": 10086}
    first, last = training["prompt_indices"]
    assert first >= 5 and last > first  # never the benchmark's first 5 MATH500 prompts
    gen, train = training["commands"][1:]
    assert gen.startswith("forerun bench presto") and "--model default" in gen and "--records" in gen
    assert train.startswith("forerun classifier train") and "--sampler presto-power-mh" in train
    assert training["regenerate"] == "scripts/train_shipped_classifier"
    assert (ROOT / training["regenerate"]).is_file()
    assert training["record_lines"] >= training["training_records"] and training["date"]


def test_the_shipped_file_is_declared_package_data():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert "forerun.classifiers.data" in setuptools["packages"]
    assert "*.json" in setuptools["package-data"]["forerun.classifiers.data"]
    assert json.loads(shipped_text())["format"] == MODEL_FORMAT
    assert (ROOT / "classifiers" / "data" / SHIPPED_FILE).is_file()


def test_a_mismatch_is_one_line_naming_what_differs():
    shipped = load_shipped()
    assert mismatch_note(shipped, shipped.model, ["power-mh"]) is None
    assert mismatch_note(shipped, None, ["power-mh"]) is None  # model unknown: nothing to say
    note = mismatch_note(shipped, "tiny", ["power-mh", "entropy-cut"])
    assert note is not None and "\n" not in note
    assert "model tiny" in note and "sampler entropy-cut" in note and "power-mh," not in note.split("not ")[1]


def test_a_broken_shipped_file_is_refused(monkeypatch):
    data = json.loads(shipped_text())
    del data["training"]
    monkeypatch.setattr("forerun.classifiers.shipped.shipped_text", lambda: json.dumps(data))
    with pytest.raises(ValueError, match="training"):
        load_shipped()


def test_the_same_model_served_by_sglang_under_its_path_is_no_mismatch():
    """SGLang's served_model_name defaults to --model-path (scripts/launch_runtime: the hub id): the shipped model
    served that way is the one it was trained on, no warning; another model under a path still is one."""
    shipped = load_shipped()
    assert shipped.model == "SmolLM2-135M-Instruct"
    for served in ("HuggingFaceTB/SmolLM2-135M-Instruct", "/models/SmolLM2-135M-Instruct/"):
        assert mismatch_note(shipped, served, ["power-mh"]) is None
    assert "model Qwen/Qwen2.5-Math-1.5B" in mismatch_note(shipped, "Qwen/Qwen2.5-Math-1.5B", ["power-mh"])
