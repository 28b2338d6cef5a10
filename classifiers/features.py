"""Scored-node records and the features of the ε-certainty classifier (PreSTO §3.3, App. E.7).

A record is one scored node of a prefetched subtree, written as one JSONL line by the samplers. Its
label is the ε-certainty class of the decision at the node, and its features are what is known
before the proposal at v+ is generated.

    paper                                    code
    A(v+, v)                                 NodeRecord.accept_prob
    ε (0.01)                                 epsilon
    ε-certain reject / accept / uncertain    CLASSES = ("reject", "accept", "uncertain")  (App. C.3 order)
    c_j (cut of the request at v+ = v_j)     NodeRecord.cut
    c_i (cut of the node v = v_i)            NodeRecord.parent_cut
    T                                        horizon (implicit: cut_fraction = c_j / T)
    Feature 1: c_j / T                       "cut_fraction"                               (default)
    Feature 2: c_i, c_i - c_j, d(v_i),       "parent_cut", "cut_gap", "depth", "accepts_on_path"
               accepts on the root path
    Features 3/4 (likelihood / entropy)      any other numeric field of the record, by its name
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..programs.acceptance import epsilon_class

__all__ = [
    "CLASSES",
    "DEFAULT_EPSILON",
    "FEATURE_SETS",
    "POST_GENERATION_FIELDS",
    "BUILTIN_FEATURES",
    "NodeRecord",
    "RecordError",
    "certainty_class",
    "class_index",
    "feature_vector",
    "feature_matrix",
    "read_node_records",
    "parse_node_record",
    "write_node_records",
    "drop_unreachable",
]

CLASSES: tuple[str, str, str] = ("reject", "accept", "uncertain")
"""The three ε-certainty classes, in the order of App. C.3 / E.7 (class indices 0, 1, 2)."""

DEFAULT_EPSILON = 0.01
"""ε of §3.3 (Table 6 default)."""


class RecordError(ValueError):
    """A malformed training record; the message names the file and line."""


def certainty_class(accept_prob: float, epsilon: float = DEFAULT_EPSILON) -> str:
    """ε-certainty class of a decision (§3.3): reject if A <= ε, accept if A >= 1 - ε, else uncertain.

    The samplers label their records with the same rule (`forerun.programs.acceptance.epsilon_class`).
    """
    return epsilon_class(float(accept_prob), epsilon)


def class_index(name: str) -> int:
    """Index of an ε-certainty class name in CLASSES."""
    try:
        return CLASSES.index(name)
    except ValueError:
        raise ValueError(f"certainty class must be one of {CLASSES}, got {name!r}") from None


@dataclass(frozen=True)
class NodeRecord:
    """One scored node of a prefetched subtree (one JSONL line)."""

    prompt_id: str
    """Prompt the chain belongs to (the cross-validation group)."""
    call_index: int
    """Index of the batched model call (prefetch round) within the prompt's run."""
    node_id: int
    """Heap index of the proposal v+ = 2i+1 in that call's prefetched subtree (the node that was
    scored; the expanded node v = i is its parent), as programs/records.py writes it."""
    depth: int
    """d(v): depth of the expanded node v (transition offset within the round)."""
    cut: int
    """c_j: cut index of the request at the acceptance child v+."""
    parent_cut: int
    """c_i: cut index (known cut κ) of v itself."""
    cut_fraction: float
    """c_j / T in [0, 1] (Feature 1)."""
    accepts_on_path: int
    """Number of acceptance edges on the path from the root to v."""
    accept_prob: float
    """A(v+, v), realized after scoring."""
    certainty_class: str
    """"reject" | "accept" | "uncertain" (the label)."""
    realized: bool
    """Whether the MH walk of the call visited v."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Any further fields of the line (e.g. likelihood statistics), usable as features by name."""

    def __post_init__(self) -> None:
        class_index(self.certainty_class)
        if not 0.0 <= self.cut_fraction <= 1.0:
            raise ValueError(f"cut_fraction must lie in [0, 1], got {self.cut_fraction!r}")
        if not 0.0 <= self.accept_prob <= 1.0:
            raise ValueError(f"accept_prob must lie in [0, 1], got {self.accept_prob!r}")
        for name in ("call_index", "node_id", "depth", "cut", "parent_cut", "accepts_on_path"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be non-negative, got {getattr(self, name)!r}")

    def to_json(self) -> dict[str, Any]:
        """The JSONL object for this record (extra fields flattened back in)."""
        out = asdict(self)
        extra = out.pop("extra")
        out.update(extra)
        return out


_REQUIRED: dict[str, str] = {
    "prompt_id": "id",
    "call_index": "int",
    "node_id": "int",
    "depth": "int",
    "cut": "int",
    "parent_cut": "int",
    "cut_fraction": "float",
    "accepts_on_path": "int",
    "accept_prob": "float",
    "certainty_class": "class",
    "realized": "bool",
}


def _convert(name: str, kind: str, value: Any) -> Any:
    if kind == "id":
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ValueError(f"field {name!r} must be a string or integer, got {value!r}")
        return str(value)
    if kind == "int":
        if isinstance(value, bool):
            raise ValueError(f"field {name!r} must be an integer, got {value!r}")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise ValueError(f"field {name!r} must be an integer, got {value!r}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"field {name!r} must be a finite number, got {value!r}")
        return float(value)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ValueError(f"field {name!r} must be true/false, got {value!r}")
    if kind == "class":
        if value not in CLASSES:
            raise ValueError(f"field {name!r} must be one of {list(CLASSES)}, got {value!r}")
        return value
    raise AssertionError(kind)


def parse_node_record(obj: Any, *, epsilon: float | None = None) -> NodeRecord:
    """Build a NodeRecord from one decoded JSON object.

    With ``epsilon`` given, the label is recomputed from ``accept_prob`` (the recorded
    ``certainty_class`` is then optional and ignored); otherwise the recorded class is the label.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    data = dict(obj)
    if epsilon is not None and "accept_prob" in data:
        data["certainty_class"] = certainty_class(_convert("accept_prob", "float", data["accept_prob"]), epsilon)
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    values = {k: _convert(k, kind, data.pop(k)) for k, kind in _REQUIRED.items()}
    return NodeRecord(**values, extra=data)


def read_node_records(paths: str | Path | Iterable[str | Path], *, epsilon: float | None = None) -> list[NodeRecord]:
    """Read JSONL scored-node records from one or more files; blank lines are skipped.

    A malformed line raises RecordError naming the file and the 1-based line number.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    records: list[NodeRecord] = []
    for path in paths:
        path = Path(path)
        try:
            handle = path.open("r", encoding="utf-8")
        except OSError as exc:
            raise RecordError(f"{path}: cannot read records file ({exc.strerror or exc})") from exc
        with handle:
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RecordError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
                try:
                    records.append(parse_node_record(obj, epsilon=epsilon))
                except ValueError as exc:
                    raise RecordError(f"{path}:{lineno}: {exc}") from exc
    return records


def write_node_records(path: str | Path, records: Iterable[NodeRecord]) -> int:
    """Write records as JSONL; returns the number of lines written."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record.to_json(), sort_keys=True) + "\n")
            n += 1
    return n


def drop_unreachable(records: Sequence[NodeRecord]) -> list[NodeRecord]:
    """Keep the records the MH walk of their call could reach, as in the E.7 dataset.

    Within one (prompt_id, call_index), the expanded nodes are the parents v of the scored
    proposals v+ (``node_id``); a record is kept iff every strict ancestor of its v was expanded too.
    This drops the requests BFS places below the rejection child of a node whose own request it
    deferred (§3.2). Order is preserved.
    """
    expanded: dict[tuple[str, int], set[int]] = {}
    for r in records:
        if r.node_id % 2 != 1:
            raise ValueError(
                f"record (prompt {r.prompt_id}, call {r.call_index}) has node_id {r.node_id}: node_id must be "
                "the heap index of an acceptance child v+ (odd)"
            )
        expanded.setdefault((r.prompt_id, r.call_index), set()).add((r.node_id - 1) // 2)
    kept = []
    for r in records:
        nodes, v, ok = expanded[(r.prompt_id, r.call_index)], (r.node_id - 1) // 2, True
        while v:
            v = (v - 1) // 2
            if v not in nodes:
                ok = False
                break
        if ok:
            kept.append(r)
    return kept


# ------------------------------------------------------------------------------------------------
# Features
# ------------------------------------------------------------------------------------------------

BUILTIN_FEATURES: dict[str, Callable[[Mapping[str, float]], float]] = {
    # Feature 1
    "cut_fraction": lambda v: v["cut_fraction"],
    # Feature 2 (tree position)
    "parent_cut": lambda v: v["parent_cut"],
    "cut_gap": lambda v: v["parent_cut"] - v["cut"],
    "depth": lambda v: v["depth"],
    "accepts_on_path": lambda v: v["accepts_on_path"],
}
"""Named features computed from a record's (or a candidate node's) fields."""

FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "1": ("cut_fraction",),
    "2": ("parent_cut", "cut_gap", "depth", "accepts_on_path"),
    "1+2": ("cut_fraction", "parent_cut", "cut_gap", "depth", "accepts_on_path"),
}
"""Feature sets of App. E.7 that records always carry (sets 3/4 use the sampler's extra fields)."""

POST_GENERATION_FIELDS = frozenset({"accept_prob", "log_accept", "accepted", "realized", "certainty_class"})
"""Record fields known only after the proposal is generated and scored: never features."""


def _record_values(record: NodeRecord) -> dict[str, Any]:
    values: dict[str, Any] = dict(record.extra)
    values.update(
        cut_fraction=record.cut_fraction,
        parent_cut=record.parent_cut,
        cut=record.cut,
        depth=record.depth,
        accepts_on_path=record.accepts_on_path,
    )
    return values


def feature_vector(names: Sequence[str], values: Mapping[str, Any]) -> np.ndarray:
    """Feature values for one node from a mapping of its fields (record fields or, at prediction
    time, what the sampler knows about the candidate). Names outside BUILTIN_FEATURES are read
    from ``values`` directly."""
    out = np.empty(len(names))
    for k, name in enumerate(names):
        try:
            raw = BUILTIN_FEATURES[name](values) if name in BUILTIN_FEATURES else values[name]
        except KeyError as exc:
            raise ValueError(f"feature {name!r} needs the value {exc.args[0]!r}, which was not given") from None
        if isinstance(raw, bool) or not isinstance(raw, (int, float, np.integer, np.floating)):
            raise ValueError(f"feature {name!r} must be numeric, got {raw!r}")
        if not math.isfinite(float(raw)):
            raise ValueError(f"feature {name!r} must be finite, got {raw!r}")
        out[k] = float(raw)
    return out


def feature_matrix(records: Sequence[NodeRecord], names: Sequence[str]) -> np.ndarray:
    """Feature matrix X (n_records × n_features)."""
    if not names:
        raise ValueError("at least one feature name is needed")
    X = np.empty((len(records), len(names)))
    for i, record in enumerate(records):
        try:
            X[i] = feature_vector(names, _record_values(record))
        except ValueError as exc:
            raise ValueError(
                f"record {i} (prompt {record.prompt_id}, call {record.call_index}, node {record.node_id}): {exc}"
            ) from None
    return X
