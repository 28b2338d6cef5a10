"""The predictive traversals without --classifier use the shipped classifier (classifiers/shipped.py), with a
one-line warning on another model, and keep the identical chain."""

from __future__ import annotations

import json

from forerun.cli.main import main

SAMPLE = ["sample", "--prompt", "abc", "--model", "tiny", "--n", "8", "--K", "8", "--seed", "3", "--json"]
WARNING = "warning: the shipped certainty classifier was trained on SmolLM2-135M-Instruct"


def test_sample_predictive_without_classifier_uses_the_shipped_one(capsys, monkeypatch):
    import forerun.classifiers.shipped as shipped

    loads = []
    real = shipped.load_shipped
    monkeypatch.setattr(shipped, "load_shipped", lambda: loads.append(1) or real())
    assert main(SAMPLE) == 0
    seq = json.loads(capsys.readouterr().out)
    assert main(SAMPLE + ["--presto", "--traversal", "predictive"]) == 0
    out, err = capsys.readouterr()
    pre = json.loads(out)
    assert loads == [1]
    assert pre["response_ids"] == seq["response_ids"] and pre["history"] == seq["history"]
    assert len(pre["transitions_per_call_list"]) < len(seq["transitions_per_call_list"])
    warnings = [line for line in err.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and WARNING in warnings[0] and "not model tiny" in warnings[0]


def test_bench_presto_predictive_without_classifier(capsys):
    argv = ["bench", "presto", "--model", "tiny", "--prompts", "1", "--n", "8", "--K", "4",
            "--traversals", "bfs", "predictive", "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["meta"]["classifier"] == "shipped: power-mh-smollm2.json"
    assert [r["identical_chains"] for r in doc["rows"]] == [1, 1]
    assert sum(WARNING in line for line in err.splitlines()) == 1


def test_no_warning_with_an_explicit_classifier(tmp_path, capsys):
    from forerun.classifiers.certainty import CertaintyClassifier

    clf = CertaintyClassifier.uniform_prior().save(tmp_path / "clf.json")
    assert main(SAMPLE + ["--presto", "--traversal", "predictive", "--classifier", str(clf)]) == 0
    assert "shipped" not in capsys.readouterr().err


def test_eval_predictive_method_no_longer_needs_classifier(tmp_path, capsys):
    run = tmp_path / "r.jsonl"
    argv = ["eval", "--model", "tiny", "--datasets", "math500", "--methods", "presto-power-mh-predictive",
            "--limit", "1", "--n", "8", "--K", "4", "--out", str(run)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert sum(WARNING in line for line in err.splitlines()) == 1
    lines = [json.loads(x) for x in run.read_text(encoding="utf-8").splitlines()]
    items = [x for x in lines if x.get("method") == "presto-power-mh-predictive"]
    assert len(items) == 1 and items[0].get("transitions") == 4
