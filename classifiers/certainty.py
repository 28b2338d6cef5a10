"""The ε-certainty classifier of the predictive traversal rule (PreSTO §3.3, App. C.3, App. E.7).

Before a request is generated, a three-class logistic regression on standardized features (by
default only the cut fraction c_j/T) predicts whether the decision at the node will be an ε-certain
reject (A <= ε), an ε-certain accept (A >= 1 - ε) or ε-uncertain; Eq. 14 turns the class
probabilities into the predicted branch probability ĥ(v+; ε) that the DP of Proposition 2 uses.
The classifier supplies ĥ only: `branch_prob_of` is the callable the one planner
(`programs.traversal.plan_prefetch`, used by the PreSTO sampler) takes.  Cross-validation is
`cross_validation`.

    paper                                   code
    ε                                       CertaintyConfig.epsilon (0.01)
    x (standardized features)               (features - feature_mean) / feature_scale
    W, b (linear layer + softmax)           CertaintyClassifier.coef, .intercept
    λ (L2 penalty, C = 1/λ)                 CertaintyConfig.l2_penalty (1.0)
    P̂(v is ε-certain reject / accept)       ClassProbabilities.p_reject / .p_accept
    P̂(v is ε-uncertain)                     ClassProbabilities.p_uncertain
    ĥ(v+; ε)                                CertaintyClassifier.branch_prob_accept      (Eq. 14,
                                            programs.allocation.branch_prob_accept)
    ĥ of a candidate node for the planner   CertaintyClassifier.branch_prob_of(node)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from ..programs.acceptance import CLASSES, EPSILON
from ..programs.allocation import branch_prob_accept as _branch_prob_accept
from ..programs.records import NodeRecord
from ..programs.traversal import CandidateNode
from .features import POST_GENERATION_FIELDS, TREE_POSITION_FEATURES, class_index, feature_matrix, feature_vector

__all__ = [
    "CertaintyConfig",
    "ClassProbabilities",
    "CertaintyClassifier",
    "MODEL_FORMAT",
]

MODEL_FORMAT = "forerun.certainty_classifier"
_MODEL_VERSION = 1
MAX_FILE_BYTES = 16 << 20
"""Largest classifier file `load` reads (a fitted model with every E.7 feature is a few KB)."""


@dataclass(frozen=True)
class CertaintyConfig:
    """Settings of the ε-certainty classifier."""

    epsilon: float = EPSILON
    """ε in (0, 1/2): the certainty threshold the labels were made with (default 0.01, §3.3)."""
    features: tuple[str, ...] = ("cut_fraction",)
    """Feature names (classifiers.features); default Feature 1, the cut fraction c_j/T, as in E.7."""
    l2_penalty: float = 1.0
    """λ > 0 of the L2 penalty in E.7 (scikit-learn C = 1/λ); default 1."""
    max_iter: int = 1000
    """Iteration cap of the lbfgs solver (> 0)."""
    allow_missing_classes: bool = False
    """If False (default) fitting on records that lack a class raises. If True, the model is fitted
    on the classes present (at least two) and an absent class gets probability 0."""

    def __post_init__(self) -> None:
        if not 0.0 < self.epsilon < 0.5:
            raise ValueError(f"epsilon must lie in (0, 1/2), got {self.epsilon!r}")
        features = tuple(self.features)
        if not features:
            raise ValueError("features must name at least one feature")
        if len(set(features)) != len(features):
            raise ValueError(f"features must not repeat a name, got {features!r}")
        leaked = sorted(set(features) & POST_GENERATION_FIELDS)
        if leaked:
            raise ValueError(
                f"features {leaked} are known only after generation and cannot predict the certainty class"
            )
        object.__setattr__(self, "features", features)
        if not (self.l2_penalty > 0.0) or math.isinf(self.l2_penalty):
            raise ValueError(f"l2_penalty must be a positive finite number, got {self.l2_penalty!r}")
        if self.max_iter < 1:
            raise ValueError(f"max_iter must be positive, got {self.max_iter!r}")


class ClassProbabilities(NamedTuple):
    """Predicted ε-certainty class probabilities of one candidate node."""

    p_reject: float
    p_accept: float
    p_uncertain: float


def labels(records: Sequence[NodeRecord]) -> np.ndarray:
    """Class indices (CLASSES order) of the records' labels."""
    return np.array([class_index(r.certainty_class) for r in records], dtype=int)


def _softmax(logits: np.ndarray) -> np.ndarray:
    top = np.max(logits, axis=1, keepdims=True)
    e = np.exp(logits - top)
    return e / e.sum(axis=1, keepdims=True)


class CertaintyClassifier:
    """Three-class logistic regression ε-certainty classifier (App. E.7).

    Fitting uses scikit-learn (``StandardScaler`` + multinomial ``LogisticRegression``); the fitted
    parameters are then kept as plain arrays, so prediction, ``save`` and ``load`` need only numpy
    and JSON (no pickle).
    """

    def __init__(self, config: CertaintyConfig | None = None) -> None:
        self.config = config or CertaintyConfig()
        self.feature_mean: np.ndarray | None = None
        self.feature_scale: np.ndarray | None = None
        self.coef: np.ndarray | None = None  # (3, d) on standardized features, CLASSES order
        self.intercept: np.ndarray | None = None  # (3,), -inf for a class absent from training
        self.class_counts: dict[str, int] = {}
        self.training_size = 0
        self.kind = "unfitted"

    # -- construction ------------------------------------------------------------------------------

    @property
    def features(self) -> tuple[str, ...]:
        return self.config.features

    @property
    def is_fitted(self) -> bool:
        return self.coef is not None

    def _set(self, mean, scale, coef, intercept, counts: Mapping[str, int], size: int, kind: str) -> "CertaintyClassifier":
        d = len(self.features)
        self.feature_mean = np.asarray(mean, dtype=float).reshape(d)
        self.feature_scale = np.asarray(scale, dtype=float).reshape(d)
        self.coef = np.asarray(coef, dtype=float).reshape(3, d)
        self.intercept = np.asarray(intercept, dtype=float).reshape(3)
        if np.any(self.feature_scale <= 0) or not np.all(np.isfinite(self.feature_scale)):
            raise ValueError("feature_scale must be positive and finite")
        if not np.all(np.isfinite(self.coef)) or not np.all(np.isfinite(self.feature_mean)):
            raise ValueError("coef and feature_mean must be finite")
        if np.any(np.isnan(self.intercept)) or np.any(self.intercept == np.inf):
            raise ValueError("intercept entries must be finite or -inf (absent class)")
        if np.all(self.intercept == -np.inf):
            raise ValueError("at least one class must have a finite intercept")
        with np.errstate(over="ignore", invalid="ignore"):  # weights on the raw features: coef / scale, its offset
            raw = self.coef / self.feature_scale
            offset = raw @ self.feature_mean
        if not (np.all(np.isfinite(raw)) and np.all(np.isfinite(offset))):
            raise ValueError("coef / feature_scale overflows (coefficients too large or scales too small for "
                             "finite class probabilities)")
        self.class_counts = {c: int(counts.get(c, 0)) for c in CLASSES}
        self.training_size = int(size)
        self.kind = kind
        return self

    @classmethod
    def uniform_prior(cls, config: CertaintyConfig | None = None) -> "CertaintyClassifier":
        """Fallback with no training data: every class 1/3, so ĥ(v+) = 1/2 at every node."""
        model = cls(config)
        d = len(model.features)
        return model._set(np.zeros(d), np.ones(d), np.zeros((3, d)), np.zeros(3), {}, 0, "uniform_prior")

    @classmethod
    def class_prior(cls, records: Sequence[NodeRecord], config: CertaintyConfig | None = None) -> "CertaintyClassifier":
        """Constant baseline of E.7: the training class frequencies for every node (absent class: 0)."""
        model = cls(config)
        if not records:
            raise ValueError("class_prior needs at least one record")
        y = labels(records)
        counts = np.bincount(y, minlength=3)
        with np.errstate(divide="ignore"):
            intercept = np.log(counts / counts.sum())
        d = len(model.features)
        named = {c: int(n) for c, n in zip(CLASSES, counts)}
        return model._set(np.zeros(d), np.ones(d), np.zeros((3, d)), intercept, named, len(records), "class_prior")

    def fit(self, records: Sequence[NodeRecord]) -> "CertaintyClassifier":
        """Fit the logistic regression of E.7 on scored-node records; returns self."""
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler

        records = list(records)
        if not records:
            raise ValueError("cannot fit the certainty classifier on zero records")
        X = feature_matrix(records, self.features)
        y = labels(records)
        counts = np.bincount(y, minlength=3)
        named = {c: int(n) for c, n in zip(CLASSES, counts)}
        present = np.flatnonzero(counts)
        if len(present) < 3:
            absent = [CLASSES[k] for k in range(3) if counts[k] == 0]
            if len(present) < 2:
                raise ValueError(
                    f"training records contain only the class {CLASSES[present[0]]!r} ({len(records)} records): "
                    "a classifier needs at least two certainty classes; use CertaintyClassifier.uniform_prior() "
                    "or class_prior() instead"
                )
            if not self.config.allow_missing_classes:
                raise ValueError(
                    f"training records contain no {' or '.join(repr(a) for a in absent)} examples "
                    f"(class counts {named}); pass allow_missing_classes=True (CLI: --allow-missing-classes) "
                    "to fit the present classes and give the absent ones probability 0"
                )
        scaler = StandardScaler().fit(X)
        Z = scaler.transform(X)
        lr = LogisticRegression(C=1.0 / self.config.l2_penalty, max_iter=self.config.max_iter)
        lr.fit(Z, y)
        d = len(self.features)
        coef = np.zeros((3, d))
        intercept = np.full(3, -np.inf)
        classes = [int(c) for c in lr.classes_]
        if len(classes) == 2:
            # binary scikit-learn model: P(classes[1]) = σ(w·z + b) = softmax over logits (0, w·z + b)
            coef[classes[0]] = 0.0
            intercept[classes[0]] = 0.0
            coef[classes[1]] = lr.coef_[0]
            intercept[classes[1]] = lr.intercept_[0]
        else:
            for row, k in enumerate(classes):
                coef[k] = lr.coef_[row]
                intercept[k] = lr.intercept_[row]
        return self._set(scaler.mean_, scaler.scale_, coef, intercept, named, len(records), "logistic_regression")

    # -- prediction --------------------------------------------------------------------------------

    def _require_fitted(self) -> None:
        if not self.is_fitted:
            raise RuntimeError("certainty classifier is not fitted: call fit(records), load(path) or uniform_prior()")

    def predict_proba_matrix(self, X: np.ndarray) -> np.ndarray:
        """Class probabilities (n × 3, CLASSES order) for a feature matrix X (n × d)."""
        self._require_fitted()
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or X.shape[1] != len(self.features):
            raise ValueError(f"X must have shape (n, {len(self.features)}) for features {self.features}, got {X.shape}")
        with np.errstate(over="ignore", invalid="ignore"):
            logits = ((X - self.feature_mean) / self.feature_scale) @ self.coef.T + self.intercept
        bad = np.isnan(logits) | (logits == np.inf)
        if np.any(bad):
            row = X[np.flatnonzero(bad.any(axis=1))[0]].tolist()
            raise ValueError(f"certainty classifier: its logits overflow at features {dict(zip(self.features, row))} "
                             "(coefficients too large for these values)")
        return _softmax(logits)

    def predict_proba_records(self, records: Sequence[NodeRecord]) -> np.ndarray:
        """Class probabilities (n × 3) for records."""
        return self.predict_proba_matrix(feature_matrix(list(records), self.features))

    def _features_of(self, cut_fraction: float, features: Mapping[str, Any]) -> np.ndarray:
        cf = float(cut_fraction)
        if not 0.0 <= cf <= 1.0:
            raise ValueError(f"cut_fraction must lie in [0, 1], got {cut_fraction!r}")
        values = dict(features)
        values["cut_fraction"] = cf
        return feature_vector(self.features, values)

    def predict_proba(self, cut_fraction: float, **features: Any) -> ClassProbabilities:
        """(P̂_rej, P̂_acc, P̂_unc) for one candidate with cut fraction c_j/T.

        Models using more than the cut fraction need those values as keyword arguments, e.g.
        ``depth=2, accepts_on_path=1, parent_cut=40, cut=17``.
        """
        p = self.predict_proba_matrix(self._features_of(cut_fraction, features)[None, :])[0]
        return ClassProbabilities(float(p[0]), float(p[1]), float(p[2]))

    def branch_prob_accept(self, cut_fraction: float, **features: Any) -> float:
        """ĥ(v+; ε) = ½(1 + P̂_acc − P̂_rej) for one candidate (Eq. 14)."""
        p = self.predict_proba(cut_fraction, **features)
        return float(_branch_prob_accept(p.p_reject, p.p_accept))

    def branch_prob_of(self, node: CandidateNode) -> float:
        """ĥ(v+; ε) of a candidate node of the planner (`plan_prefetch(branch_prob=...)`,
        `PrefetchConfig.branch_prob`): the features are read from what the planner knows about it."""
        values = node.values()
        return self.branch_prob_accept(values.pop("cut_fraction"), **values)

    @property
    def uses_tree_position(self) -> bool:
        """Whether a feature reads the node's tree position (κ(v), accepts on the path): pass it as the
        planner's `tree_position` so the DP runs over (depth, κ, accepts) states."""
        return bool(set(self.features) & TREE_POSITION_FEATURES)

    def branch_prob_accept_many(self, cut_fractions: Sequence[float], **features: Sequence[Any]) -> np.ndarray:
        """ĥ(v+; ε) for several candidates at once (e.g. one per depth for the DP)."""
        cfs = np.asarray(cut_fractions, dtype=float).reshape(-1)
        if np.any((cfs < 0) | (cfs > 1)) or np.any(np.isnan(cfs)):
            raise ValueError("cut_fractions must lie in [0, 1]")
        for name, vals in features.items():
            if len(vals) != len(cfs):
                raise ValueError(f"feature {name!r} has {len(vals)} values for {len(cfs)} cut fractions")
        X = np.stack(
            [self._features_of(cf, {k: v[i] for k, v in features.items()}) for i, cf in enumerate(cfs)]
        ) if len(cfs) else np.empty((0, len(self.features)))
        p = self.predict_proba_matrix(X)
        return _branch_prob_accept(p[:, 0], p[:, 1])

    # -- persistence -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        self._require_fitted()
        return {
            "format": MODEL_FORMAT,
            "version": _MODEL_VERSION,
            "model": self.kind,
            "classes": list(CLASSES),
            "epsilon": self.config.epsilon,
            "features": list(self.features),
            "l2_penalty": self.config.l2_penalty,
            "feature_mean": self.feature_mean.tolist(),
            "feature_scale": self.feature_scale.tolist(),
            "coef": self.coef.tolist(),
            # null marks a class absent from training (logit -inf, probability 0)
            "intercept": [None if math.isinf(v) else float(v) for v in self.intercept],
            "training_size": self.training_size,
            "class_counts": dict(self.class_counts),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "model") -> "CertaintyClassifier":
        def bad(msg: str) -> ValueError:
            return ValueError(f"{source}: {msg}")

        if not isinstance(data, Mapping):
            raise bad("expected a JSON object")
        if data.get("format") != MODEL_FORMAT:
            raise bad(f"field 'format' must be {MODEL_FORMAT!r}, got {data.get('format')!r}")
        if data.get("version") != _MODEL_VERSION:
            raise bad(f"unsupported field 'version' {data.get('version')!r} (expected {_MODEL_VERSION})")
        if not isinstance(data.get("classes"), list) or data["classes"] != list(CLASSES):
            raise bad(f"field 'classes' must be {list(CLASSES)}, got {data.get('classes')!r}")
        for key in ("epsilon", "features", "l2_penalty", "feature_mean", "feature_scale", "coef", "intercept"):
            if key not in data:
                raise bad(f"missing field {key!r}")
        try:
            config = CertaintyConfig(
                epsilon=float(data["epsilon"]),
                features=tuple(str(f) for f in data["features"]),
                l2_penalty=float(data["l2_penalty"]),
                allow_missing_classes=any(v is None for v in data["intercept"]),
            )
            intercept = [-np.inf if v is None else float(v) for v in data["intercept"]]
            model = cls(config)
            d = len(config.features)
            for key, shape in (("feature_mean", (d,)), ("feature_scale", (d,)), ("coef", (3, d))):
                if np.asarray(data[key], dtype=float).shape != shape:
                    raise ValueError(f"field {key!r} must have shape {shape}")
            if len(intercept) != 3:
                raise ValueError("field 'intercept' must have 3 entries")
            if not isinstance(data.get("class_counts", {}), Mapping):
                raise ValueError("field 'class_counts' must be an object of class counts")
            return model._set(
                data["feature_mean"],
                data["feature_scale"],
                data["coef"],
                intercept,
                data.get("class_counts", {}),
                int(data.get("training_size", 0)),
                str(data.get("model", "logistic_regression")),
            )
        except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: int() of an infinite count
            raise bad(str(exc)) from None

    def save(self, path: str | Path) -> Path:
        """Write the model as JSON (coefficients, classes, features, standardization, training size).  A regular file
        is replaced whole or not at all (written beside it, then renamed over it): a write that fails half-way (a
        full disk) leaves the model that was there.  A device or FIFO (/dev/stdout) is written in place."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        if path.exists() and not path.is_file():
            path.write_text(text, encoding="utf-8")
            return path
        target = path.resolve()  # through a symlink: the file it names is replaced, the link stays
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            mask = os.umask(0o022)
            os.umask(mask)
            os.chmod(tmp, (target.stat().st_mode & 0o777) if target.exists() else 0o666 & ~mask)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return path

    @classmethod
    def load(cls, path: str | Path) -> "CertaintyClassifier":
        """Read a model written by ``save``."""
        path = Path(path)
        try:
            with path.open("rb") as fh:  # bounded: /dev/zero or a huge file must not fill the memory
                raw = fh.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"{path}: cannot read classifier file ({exc.strerror or exc})") from exc
        if len(raw) > MAX_FILE_BYTES:
            raise ValueError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB, not a classifier file (one is a few KB)")
        text = raw.decode("utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
        except RecursionError:
            raise ValueError(f"{path}: not a classifier file (JSON nested too deeply)") from None
        return cls.from_dict(data, source=str(path))

    def __repr__(self) -> str:
        return f"CertaintyClassifier(kind={self.kind!r}, features={self.features!r}, training_size={self.training_size})"
