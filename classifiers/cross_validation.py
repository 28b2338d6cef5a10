"""Cross-validation of the ε-certainty classifier as in PreSTO App. E.7.

Folds hold out whole prompts (`StratifiedGroupKFold` on `prompt_id`), out-of-fold class probabilities
are pooled over all records, and accuracy / macro-F1 / log loss are reported against the constant
baselines fitted on the same training folds.

    paper                                   code
    ℒ(𝒰) (pooled held-out log loss)          CrossValidationReport.log_loss              (Eq. 25)
    majority / class-frequency baselines    CrossValidationReport.baseline_*
    folds holding out whole prompts         certainty_cv_splits(group_by_prompt=True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..programs.acceptance import CLASSES
from ..programs.records import NodeRecord
from .certainty import CertaintyClassifier, CertaintyConfig, labels
from .features import feature_matrix

__all__ = ["CrossValidationReport", "certainty_cv_splits", "cross_validate_certainty", "format_cv_table"]


@dataclass(frozen=True)
class CrossValidationReport:
    """Pooled out-of-fold metrics of the classifier and of the constant baselines (E.7)."""

    n_records: int
    n_prompts: int
    folds: int
    grouped_by_prompt: bool
    features: tuple[str, ...]
    class_counts: dict[str, int]
    accuracy: float
    macro_f1: float
    log_loss: float
    baseline_accuracy: float
    """Always predicting the training fold's most frequent class."""
    baseline_macro_f1: float
    baseline_log_loss: float
    """Predicting the training fold's class frequencies for every node."""
    fold_metrics: tuple[dict[str, float], ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_records": self.n_records,
            "n_prompts": self.n_prompts,
            "folds": self.folds,
            "grouped_by_prompt": self.grouped_by_prompt,
            "features": list(self.features),
            "class_counts": dict(self.class_counts),
            "classifier": {"accuracy": self.accuracy, "macro_f1": self.macro_f1, "log_loss": self.log_loss},
            "baseline": {
                "accuracy": self.baseline_accuracy,
                "macro_f1": self.baseline_macro_f1,
                "log_loss": self.baseline_log_loss,
            },
            "fold_metrics": [dict(m) for m in self.fold_metrics],
        }


def _metrics(y: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score, log_loss

    pred = np.argmax(proba, axis=1)
    # clip before log loss so a class a fold never saw (probability 0) costs a large, finite loss
    clipped = np.clip(proba, 1e-15, 1.0)
    clipped /= clipped.sum(axis=1, keepdims=True)
    return {
        "accuracy": float(accuracy_score(y, pred)),
        "macro_f1": float(f1_score(y, pred, labels=[0, 1, 2], average="macro", zero_division=0)),
        "log_loss": float(log_loss(y, clipped, labels=[0, 1, 2])),
    }


def _check_folds(folds: int) -> None:
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ValueError(f"folds must be an integer >= 2, got {folds!r}")


def _check_enough_records(folds: int, n_records: int) -> None:
    if n_records < folds:
        raise ValueError(f"cross-validation with {folds} folds needs at least {folds} records, got {n_records}")


def certainty_cv_splits(
    records: Sequence[NodeRecord], *, folds: int = 5, seed: int = 0, group_by_prompt: bool = True
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) index arrays of the E.7 cross-validation: ``StratifiedGroupKFold`` with the
    prompt as the group (whole prompts held out), or ``StratifiedKFold`` over nodes."""
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

    records = list(records)
    _check_folds(folds)
    y = labels(records)
    X = np.zeros((len(records), 1))
    if group_by_prompt:
        groups = np.array([r.prompt_id for r in records])
        n_prompts = len(set(groups.tolist()))
        if n_prompts < folds:
            raise ValueError(
                f"holding out whole prompts with {folds} folds needs at least {folds} distinct prompt_id values, "
                f"got {n_prompts}; use fewer folds or group_by_prompt=False (CLI: --no-group)"
            )
        splitter = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
        return [(tr, te) for tr, te in splitter.split(X, y, groups)]
    _check_enough_records(folds, len(records))
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    return [(tr, te) for tr, te in splitter.split(X, y)]


def _out_of_fold(
    records: list[NodeRecord], y: np.ndarray, splits: list[tuple[np.ndarray, np.ndarray]],
    config: CertaintyConfig, progress: bool,
) -> tuple[np.ndarray, np.ndarray, list[dict[str, float]]]:
    """Pooled out-of-fold probabilities of the classifier and of the class-frequency baseline, and the
    metrics of each fold."""
    from tqdm import tqdm

    proba = np.zeros((len(records), 3))
    base = np.zeros((len(records), 3))
    fold_metrics: list[dict[str, float]] = []
    for k, (train, test) in enumerate(tqdm(splits, desc="cv folds", disable=not progress)):
        train_records = [records[i] for i in train]
        test_records = [records[i] for i in test]
        if len(set(y[train].tolist())) < 2:
            model = CertaintyClassifier.class_prior(train_records, config)
        else:
            model = CertaintyClassifier(config).fit(train_records)
        proba[test] = model.predict_proba_records(test_records)
        base[test] = CertaintyClassifier.class_prior(train_records, config).predict_proba_records(test_records)
        fold_metrics.append({"fold": k, "n_test": int(len(test)), **_metrics(y[test], proba[test])})
    return proba, base, fold_metrics


def cross_validate_certainty(
    records: Sequence[NodeRecord],
    config: CertaintyConfig | None = None,
    *,
    folds: int = 5,
    seed: int = 0,
    group_by_prompt: bool = True,
    progress: bool = False,
) -> CrossValidationReport:
    """k-fold cross-validation as in E.7: whole prompts held out (``StratifiedGroupKFold`` on
    ``prompt_id``), out-of-fold probabilities pooled over all records, accuracy / macro-F1 / log loss
    against the majority-class and class-frequency baselines fitted on the same training folds.

    ``group_by_prompt=False`` uses ``StratifiedKFold`` over nodes instead. Folds whose training part
    lacks a class are fitted on the classes present (the absent class gets probability 0).
    """
    config = config or CertaintyConfig()
    records = list(records)
    _check_folds(folds)
    _check_enough_records(folds, len(records))
    y = labels(records)
    counts = np.bincount(y, minlength=3)
    if np.count_nonzero(counts) < 2:
        named = dict(zip(CLASSES, counts.tolist()))
        raise ValueError(f"records contain a single certainty class (counts {named}): nothing to classify")
    feature_matrix(records, config.features)  # fail early on a missing or non-numeric feature
    splits = certainty_cv_splits(records, folds=folds, seed=seed, group_by_prompt=group_by_prompt)
    fold_config = CertaintyConfig(epsilon=config.epsilon, features=config.features, l2_penalty=config.l2_penalty,
                                  max_iter=config.max_iter, allow_missing_classes=True)
    proba, base, fold_metrics = _out_of_fold(records, y, splits, fold_config, progress)
    clf = _metrics(y, proba)
    # the class-frequency baseline's most likely class is the training fold's majority class
    bl = _metrics(y, base)
    return CrossValidationReport(
        n_records=len(records), n_prompts=len({r.prompt_id for r in records}), folds=folds,
        grouped_by_prompt=group_by_prompt, features=config.features,
        class_counts={c: int(n) for c, n in zip(CLASSES, counts)},
        accuracy=clf["accuracy"], macro_f1=clf["macro_f1"], log_loss=clf["log_loss"],
        baseline_accuracy=bl["accuracy"], baseline_macro_f1=bl["macro_f1"], baseline_log_loss=bl["log_loss"],
        fold_metrics=tuple(fold_metrics),
    )


def format_cv_table(report: CrossValidationReport) -> str:
    """Plain-text table of a cross-validation report."""
    counts = ", ".join(f"{c} {n}" for c, n in report.class_counts.items())
    split = "whole prompts held out" if report.grouped_by_prompt else "nodes (not grouped by prompt)"
    lines = [
        f"records {report.n_records} from {report.n_prompts} prompts; classes: {counts}",
        f"{report.folds}-fold cross-validation, {split}; features: {', '.join(report.features)}",
        "",
        f"{'metric':<10} {'classifier':>11} {'baseline':>10}",
        f"{'accuracy':<10} {report.accuracy:>11.3f} {report.baseline_accuracy:>10.3f}",
        f"{'macro-F1':<10} {report.macro_f1:>11.3f} {report.baseline_macro_f1:>10.3f}",
        f"{'log loss':<10} {report.log_loss:>11.3f} {report.baseline_log_loss:>10.3f}",
        "",
        "baseline: majority class of the training fold (accuracy, macro-F1); its class frequencies (log loss)",
    ]
    return "\n".join(lines)
