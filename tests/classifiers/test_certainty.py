"""Tests for the ε-certainty classifier and its cross-validation (PreSTO App. E.7)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from forerun.classifiers.certainty import CertaintyClassifier, CertaintyConfig, ClassProbabilities
from forerun.classifiers.cross_validation import certainty_cv_splits, cross_validate_certainty, format_cv_table
from forerun.classifiers.features import class_index, feature_matrix
from forerun.programs.acceptance import CLASSES
from forerun.testing.synthetic_records import synthetic_node_records
from forerun.programs.allocation import (
    branch_prob_accept,
    expected_transitions,
    optimal_allocation,
    optimal_allocation_general,
)
from forerun.programs.prefetch_tree import bfs_collect, is_expandable, known_cut, node_depth, parent_of
from forerun.programs.traversal import plan_prefetch


def predictive_plan(model, cuts, T, budget, **kw):
    """The one planner with the classifier's ĥ (what the PreSTO sampler runs with --traversal predictive),
    under the paper's node budget (the DP of Proposition 2) unless told otherwise."""
    kw.setdefault("budget_unit", "node")
    return plan_prefetch(cuts, T, budget, traversal="predictive", branch_prob=model.branch_prob_of,
                         tree_position=model.uses_tree_position, **kw)


@pytest.fixture(scope="module")
def records():
    return synthetic_node_records(n_prompts=12, calls_per_prompt=6, nodes_per_call=8, seed=11)


@pytest.fixture(scope="module")
def fitted(records):
    return CertaintyClassifier().fit(records)


def test_config_validation():
    with pytest.raises(ValueError, match="epsilon"):
        CertaintyConfig(epsilon=0.5)
    with pytest.raises(ValueError, match="features"):
        CertaintyConfig(features=())
    with pytest.raises(ValueError, match="features"):
        CertaintyConfig(features=("cut_fraction", "cut_fraction"))
    with pytest.raises(ValueError, match="after generation"):
        CertaintyConfig(features=("cut_fraction", "log_accept"))
    with pytest.raises(ValueError, match="l2_penalty"):
        CertaintyConfig(l2_penalty=0.0)
    with pytest.raises(ValueError, match="max_iter"):
        CertaintyConfig(max_iter=0)
    assert CertaintyConfig().features == ("cut_fraction",)


def test_numpy_prediction_matches_sklearn_pipeline(records, fitted):
    X = feature_matrix(records, ("cut_fraction",))
    y = np.array([class_index(r.certainty_class) for r in records])
    ref = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000)).fit(X, y)
    ours = fitted.predict_proba_matrix(X)
    np.testing.assert_allclose(ours, ref.predict_proba(X), rtol=1e-10, atol=1e-12)


def test_probabilities_and_branch_prob(fitted):
    for cf in np.linspace(0, 1, 11):
        p = fitted.predict_proba(cf)
        assert isinstance(p, ClassProbabilities)
        assert all(0 < q < 1 for q in p)
        assert math.isclose(sum(p), 1.0, rel_tol=1e-12)
        h = fitted.branch_prob_accept(cf)
        assert math.isclose(h, branch_prob_accept(p.p_reject, p.p_accept), rel_tol=1e-12)
        assert 0 < h < 1
    many = fitted.branch_prob_accept_many([0.0, 0.5, 1.0])
    np.testing.assert_allclose(many, [fitted.branch_prob_accept(c) for c in (0.0, 0.5, 1.0)], rtol=1e-12)
    # the synthetic data make late cuts likelier to be accepted
    assert fitted.branch_prob_accept(0.95) > fitted.branch_prob_accept(0.05)
    with pytest.raises(ValueError, match="cut_fraction"):
        fitted.predict_proba(1.5)


def test_a_save_that_fails_leaves_the_model_that_was_there(tmp_path, fitted, monkeypatch):
    """`classifier train --out` over a good model: a write that fails (a full disk) must not leave a truncated file
    in its place; the model is written beside it and renamed over it.  Its mode and a symlink to it are kept."""
    import os

    from forerun.classifiers import certainty

    path = fitted.save(tmp_path / "model.json")
    os.chmod(path, 0o640)
    path.write_text(path.read_text().replace('"training_size"', '"training_size" ', 1))  # the older model's bytes
    before = path.read_bytes()

    def disk_full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(certainty.os, "replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        fitted.save(path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["model.json"]
    monkeypatch.undo()
    link = tmp_path / "link.json"
    link.symlink_to(path)
    fitted.save(link)
    assert link.is_symlink() and path.read_bytes() != before and path.stat().st_mode & 0o777 == 0o640
    assert CertaintyClassifier.load(link).training_size == fitted.training_size


def test_save_load_roundtrip_is_json(tmp_path, fitted):
    path = fitted.save(tmp_path / "sub" / "model.json")
    data = json.loads(path.read_text())
    assert data["classes"] == list(CLASSES)
    assert data["features"] == ["cut_fraction"]
    assert data["training_size"] == fitted.training_size
    assert len(data["coef"]) == 3
    loaded = CertaintyClassifier.load(path)
    grid = np.linspace(0, 1, 7)[:, None]
    np.testing.assert_array_equal(loaded.predict_proba_matrix(grid), fitted.predict_proba_matrix(grid))
    assert loaded.class_counts == fitted.class_counts


def test_load_rejects_bad_files(tmp_path, fitted):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json.*not valid JSON"):
        CertaintyClassifier.load(bad)
    data = fitted.to_dict()
    data["coef"] = [[0.0, 1.0]] * 3
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="bad.json.*coef"):
        CertaintyClassifier.load(bad)
    data = fitted.to_dict()
    del data["intercept"]
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="intercept"):
        CertaintyClassifier.load(bad)
    data = fitted.to_dict()
    data["format"] = "pickle"
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="format"):
        CertaintyClassifier.load(bad)
    with pytest.raises(ValueError, match="cannot read"):
        CertaintyClassifier.load(tmp_path / "missing.json")


@pytest.mark.parametrize("field, value, text", [
    ("class_counts", [1, 2, 3], None),  # a list where an object belongs (was AttributeError)
    ("classes", None, None),  # null classes (was TypeError outside the checks)
    ("training_size", None, '1e999'),  # JSON's 1e999 reads as inf (was OverflowError)
    ("class_counts", None, '{"reject": 1e999}'),
])
def test_load_reports_hostile_fields_as_value_errors(tmp_path, fitted, field, value, text):
    """Every malformed field is a ValueError naming the file (the CLI's one-line usage error), never another type."""
    bad = tmp_path / "hostile.json"
    data = fitted.to_dict()
    data[field] = value if text is None else "@@"
    bad.write_text(json.dumps(data).replace('"@@"', text or '"@@"'))
    with pytest.raises(ValueError, match=f"hostile.json.*{field}|hostile.json: cannot convert"):
        CertaintyClassifier.load(bad)


def test_load_reports_deeply_nested_json_as_value_error(tmp_path):
    bad = tmp_path / "deep.json"
    bad.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match="deep.json.*nested too deeply"):
        CertaintyClassifier.load(bad)


def test_uniform_prior_and_class_prior(records):
    uni = CertaintyClassifier.uniform_prior()
    assert uni.predict_proba(0.3) == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert uni.branch_prob_accept(0.9) == pytest.approx(0.5)
    prior = CertaintyClassifier.class_prior(records)
    counts = np.bincount([class_index(r.certainty_class) for r in records], minlength=3)
    assert prior.predict_proba(0.7) == pytest.approx(tuple(counts / counts.sum()))
    with pytest.raises(RuntimeError, match="not fitted"):
        CertaintyClassifier().predict_proba(0.5)


def test_missing_class_is_an_error_by_default(tmp_path):
    recs = synthetic_node_records(n_prompts=6, seed=2, classes=("reject", "accept"))
    with pytest.raises(ValueError, match="no 'uncertain' examples.*allow_missing_classes"):
        CertaintyClassifier().fit(recs)
    model = CertaintyClassifier(CertaintyConfig(allow_missing_classes=True)).fit(recs)
    for cf in (0.0, 0.4, 1.0):
        p = model.predict_proba(cf)
        assert p.p_uncertain == 0.0
        assert math.isclose(p.p_reject + p.p_accept, 1.0)
        assert 0 < model.branch_prob_accept(cf) < 1
    # matches the binary scikit-learn model on the present classes
    X = feature_matrix(recs, ("cut_fraction",))
    y = np.array([class_index(r.certainty_class) for r in recs])
    ref = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000)).fit(X, y)
    np.testing.assert_allclose(model.predict_proba_matrix(X)[:, :2], ref.predict_proba(X), rtol=1e-10, atol=1e-12)
    # absent class survives the JSON roundtrip (stored as null)
    path = model.save(tmp_path / "m.json")
    assert json.loads(path.read_text())["intercept"][2] is None
    again = CertaintyClassifier.load(path)
    assert again.predict_proba(0.4) == pytest.approx(model.predict_proba(0.4))


def test_single_class_cannot_be_fitted():
    recs = synthetic_node_records(n_prompts=3, seed=3, classes=("reject",))
    with pytest.raises(ValueError, match="only the class 'reject'"):
        CertaintyClassifier(CertaintyConfig(allow_missing_classes=True)).fit(recs)
    with pytest.raises(ValueError, match="zero records"):
        CertaintyClassifier().fit([])


def test_more_features_need_their_values(records):
    config = CertaintyConfig(features=("cut_fraction", "depth", "accepts_on_path", "cut_gap", "loglik_mean"))
    model = CertaintyClassifier(config).fit(records)
    p = model.predict_proba(0.5, depth=2, accepts_on_path=1, parent_cut=40, cut=32, loglik_mean=-0.3)
    assert math.isclose(sum(p), 1.0)
    with pytest.raises(ValueError, match="'depth'"):
        model.predict_proba(0.5)
    h = model.branch_prob_accept_many(
        [0.2, 0.8], depth=[0, 1], accepts_on_path=[0, 1], parent_cut=[64, 50], cut=[13, 50], loglik_mean=[0.0, 0.1]
    )
    assert h.shape == (2,)


def test_cv_splits_hold_out_whole_prompts(records):
    splits = certainty_cv_splits(records, folds=4, seed=0)
    assert len(splits) == 4
    seen = np.concatenate([te for _, te in splits])
    assert sorted(seen.tolist()) == list(range(len(records)))
    for train, test in splits:
        assert not {records[i].prompt_id for i in train} & {records[i].prompt_id for i in test}
    with pytest.raises(ValueError, match="distinct prompt_id"):
        certainty_cv_splits(records[:48], folds=5)  # a single prompt
    ungrouped = certainty_cv_splits(records[:48], folds=5, group_by_prompt=False)
    assert len(ungrouped) == 5


def test_cross_validation_pools_out_of_fold_predictions(records):
    report = cross_validate_certainty(records, folds=4, seed=0)
    # oracle: the same folds through a plain scikit-learn pipeline
    X = feature_matrix(records, ("cut_fraction",))
    y = np.array([class_index(r.certainty_class) for r in records])
    proba = np.zeros((len(records), 3))
    for train, test in certainty_cv_splits(records, folds=4, seed=0):
        pipe = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000)).fit(X[train], y[train])
        proba[test] = pipe.predict_proba(X[test])
    assert math.isclose(report.log_loss, log_loss(y, proba, labels=[0, 1, 2]), rel_tol=1e-9)
    assert math.isclose(report.accuracy, float(np.mean(proba.argmax(1) == y)), rel_tol=1e-12)
    assert report.n_records == len(records) and report.n_prompts == 12 and report.folds == 4
    assert sum(m["n_test"] for m in report.fold_metrics) == len(records)
    # the synthetic labels depend on the cut fraction: the classifier beats the constant baselines
    assert report.log_loss < report.baseline_log_loss
    assert report.accuracy >= report.baseline_accuracy
    assert report.macro_f1 > report.baseline_macro_f1
    majority = np.bincount(y).max() / len(y)
    assert report.baseline_accuracy <= majority + 1e-12
    table = format_cv_table(report)
    assert "accuracy" in table and "log loss" in table and "macro-F1" in table
    assert json.loads(json.dumps(report.to_dict()))["classifier"]["accuracy"] == report.accuracy


def test_cross_validation_errors(records):
    with pytest.raises(ValueError, match="folds"):
        cross_validate_certainty(records, folds=1)
    one = synthetic_node_records(n_prompts=6, seed=4, classes=("accept",))
    with pytest.raises(ValueError, match="single certainty class"):
        cross_validate_certainty(one, folds=3)
    with pytest.raises(ValueError, match="'nope'"):
        cross_validate_certainty(records, CertaintyConfig(features=("nope",)), folds=3)


@pytest.mark.filterwarnings("ignore:The least populated class")
def test_cross_validation_tolerates_a_class_missing_from_a_fold():
    recs = synthetic_node_records(n_prompts=6, calls_per_prompt=2, nodes_per_call=4, seed=5)
    # keep a single uncertain example: some training folds lack the class entirely
    first = next(i for i, r in enumerate(recs) if r.certainty_class == "uncertain")
    recs = [r for i, r in enumerate(recs) if r.certainty_class != "uncertain" or i == first]
    report = cross_validate_certainty(recs, folds=3)
    assert math.isfinite(report.log_loss)


def test_predictive_plan_with_cut_fraction_model(fitted):
    rng = np.random.default_rng(0)
    T = 64
    cuts = [int(c) for c in rng.integers(0, T, size=30)]
    plan = predictive_plan(fitted, cuts, T, 12)
    probs = fitted.branch_prob_accept_many([c / T for c in cuts])
    ref = optimal_allocation(cuts, T, list(probs), 12)
    assert (plan.expanded, plan.predicted_transitions) == (ref.selected, ref.value)
    assert 1 <= len(plan.requests) <= 12


def test_predictive_plan_with_tree_position_features(records):
    model = CertaintyClassifier(CertaintyConfig(features=("cut_fraction", "cut_gap", "accepts_on_path"))).fit(records)
    rng = np.random.default_rng(1)
    T = 64
    for _ in range(5):
        cuts = sorted((int(c) for c in rng.integers(0, T, size=6)), reverse=True)
        budget = int(rng.integers(1, 7))

        def h(v: int) -> float:
            accepts, u = 0, v
            while u:
                accepts += u % 2
                u = parent_of(u)
            d = node_depth(v)
            return model.branch_prob_accept(
                cuts[d] / T, cut=cuts[d], parent_cut=known_cut(v, cuts, T), accepts_on_path=accepts
            )

        assert model.uses_tree_position
        plan = predictive_plan(model, cuts, T, budget)
        ref = optimal_allocation_general(lambda v: is_expandable(v, cuts, T), h, budget, max_depth=len(cuts))
        assert math.isclose(plan.predicted_transitions, ref.value, rel_tol=1e-9)
        assert math.isclose(expected_transitions(plan.expanded, h), plan.predicted_transitions, rel_tol=1e-9)


def test_predictive_plan_extra_features_per_depth(records):
    model = CertaintyClassifier(CertaintyConfig(features=("cut_fraction", "loglik_mean"))).fit(records)
    with pytest.raises(ValueError, match="'loglik_mean'"):
        predictive_plan(model, [5, 3], 10, 2)
    plan = predictive_plan(model, [5, 3], 10, 2, depth_features={"loglik_mean": [0.1, -0.2]})
    assert len(plan.requests) == 2


def test_predictive_rule_realizes_more_transitions_than_bfs_in_a_toy_world():
    """End to end: classifier fitted on records from a toy world whose certainty class depends on
    the cut fraction, then paired walks (same acceptance probabilities and uniforms per node) through
    the predictive and the BFS selections. Behaviour, not time: the predictive rule completes more
    transitions per call on average."""
    train = synthetic_node_records(n_prompts=30, calls_per_prompt=10, nodes_per_call=10, seed=0)
    model = CertaintyClassifier().fit(train)
    rng = np.random.default_rng(1)
    T, depth, budget, eps = 64, 8, 10, 0.01
    n_nodes = 2 ** (depth + 1) - 1

    depths = np.array([node_depth(v) for v in range(n_nodes)])

    def toy_accept_probs(cuts) -> np.ndarray:  # the law synthetic_node_records draws from
        frac = np.array([cuts[d] / T if d < depth else 0.0 for d in depths])
        logits = np.stack([3.0 * (0.5 - frac), 3.0 * (frac - 0.5), np.full(n_nodes, -0.3)], axis=1)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        cdf = np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1)
        k = (rng.random(n_nodes)[:, None] > cdf).sum(axis=1).clip(0, 2)
        lo = np.array([0.0, 1 - eps, eps])[k]
        hi = np.array([eps, 1.0, 1 - eps])[k]
        return rng.uniform(lo, hi)

    def walk(selected, A, U) -> int:
        v, n = 0, 0
        while v in selected:
            n += 1
            v = 2 * v + 1 if U[v] < A[v] else 2 * v + 2
        return n

    pred_total = bfs_total = 0
    for _ in range(300):
        cuts = [int(c) for c in rng.integers(0, T, size=depth)]
        A = toy_accept_probs(cuts)
        U = rng.random(n_nodes)
        pred = predictive_plan(model, cuts, T, budget)
        bfs = bfs_collect(cuts, T, budget, depth)
        assert len(pred.requests) <= budget and len(bfs.requests) <= budget
        pred_total += walk(pred.expanded, A, U)
        bfs_total += walk(bfs.expanded, A, U)  # the walk stops at a deferred node by itself
    assert pred_total > 1.03 * bfs_total, (pred_total, bfs_total)


def test_coefficients_that_overflow_are_refused_at_load_not_nan_at_prediction(tmp_path, fitted):
    """Finite but huge weights on the raw features (coef / feature_scale = inf): refused when the file loads,
    naming it, instead of NaN probabilities (a ValueError about p_reject) in the middle of a run."""
    bad = tmp_path / "huge.json"
    data = fitted.to_dict()
    data["coef"], data["feature_scale"] = [[-1e308], [1e308], [0.0]], [1e-300]
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="huge.json.*overflows"):
        CertaintyClassifier.load(bad)


def test_logits_that_overflow_on_large_features_are_a_clear_error(records):
    """Weights finite on their own whose sum overflows at some feature values: a ValueError naming the values,
    never NaN probabilities."""
    model = CertaintyClassifier(CertaintyConfig(features=("cut_fraction", "parent_cut")))
    model._set([0.0, 0.0], [1.0, 1.0], [[1e308, -1e308], [0.0, 0.0], [0.0, 0.0]], [0.0, 0.0, 0.0], {}, 1, "test")
    np.testing.assert_allclose(model.predict_proba_matrix(np.array([[0.5, 0.5]])).sum(), 1.0)
    with pytest.raises(ValueError, match="overflow at features"):
        model.predict_proba_matrix(np.array([[1.0, -1.0]]) * 1e10)


def test_load_reads_a_bounded_amount(tmp_path, fitted, monkeypatch):
    """An endless or huge file is refused after MAX_FILE_BYTES, not read into memory whole (/dev/zero: MemoryError)."""
    import forerun.classifiers.certainty as certainty

    path = fitted.save(tmp_path / "padded.json")
    data = json.loads(path.read_text())
    data["padding"] = "x" * 4096
    path.write_text(json.dumps(data))
    monkeypatch.setattr(certainty, "MAX_FILE_BYTES", 2048, raising=False)
    with pytest.raises(ValueError, match="padded.json: larger than"):
        CertaintyClassifier.load(path)
    monkeypatch.setattr(certainty, "MAX_FILE_BYTES", 1 << 20)
    assert CertaintyClassifier.load(path).training_size == fitted.training_size
    with pytest.raises(ValueError, match="/dev/zero: larger than"):
        CertaintyClassifier.load("/dev/zero")
