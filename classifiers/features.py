"""Features of the ε-certainty classifier (PreSTO §3.3, App. E.7) over the samplers' node records.

A record (`programs.records.NodeRecord`, one JSONL line per scored node) is labelled with the ε-certainty
class of the decision at the node; its features are what is known before the proposal at v+ is
generated.  At prediction time the same features are read from a `programs.traversal.CandidateNode`.

    paper                                    code
    ε-certain reject / accept / uncertain    programs.acceptance.CLASSES (App. C.3 order), class_index
    c_j (cut of the request at v+ = v_j)     NodeRecord.cut
    c_i (cut of the node v = v_i)            NodeRecord.parent_cut
    T                                        horizon (implicit: cut_fraction = c_j / T)
    Feature 1: c_j / T                       "cut_fraction"                               (default)
    Feature 2: c_i, c_i - c_j, d(v_i),       "parent_cut", "cut_gap", "depth", "accepts_on_path"
               accepts on the root path      (TREE_POSITION_FEATURES: those that need κ(v) or the path)
    Feature 3 (likelihood of the root state) "logq_at_cut", "logq_jump_in", "logq_jump_out", "logq_suffix_mean"
    Feature 4 (entropy of the root state)    "entropy_at_cut", ..., "entropy_suffix_mean"  (programs.cut_statistics;
                                             written into every record, handed to the planner per depth)
    forerun's ratio statistics (not E.7)     "logz_suffix_sum", "logz_suffix_expected" (programs.cut_statistics;
                                             in every record, handed to the planner per depth; by name)
    any other numeric field of a record      by its name
    E.7 dataset (walk-reachable nodes)       drop_unreachable
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..programs.acceptance import CLASSES
from ..programs.cut_statistics import ENTROPY_FEATURES, LIKELIHOOD_FEATURES, RATIO_FEATURES
from ..programs.prefetch_tree import ancestors_in, is_accept_child, parent_of
from ..programs.records import NodeRecord

__all__ = [
    "FEATURE_SETS",
    "POST_GENERATION_FIELDS",
    "TREE_POSITION_FEATURES",
    "BUILTIN_FEATURES",
    "class_index",
    "feature_vector",
    "feature_matrix",
    "drop_unreachable",
]


def class_index(name: str) -> int:
    """Index of an ε-certainty class name in CLASSES."""
    try:
        return CLASSES.index(name)
    except ValueError:
        raise ValueError(f"certainty class must be one of {CLASSES}, got {name!r}") from None


def drop_unreachable(records: Sequence[NodeRecord]) -> list[NodeRecord]:
    """Keep the records the MH walk of their call could reach, as in the E.7 dataset.

    Within one (prompt_id, traversal, call_index), the expanded nodes are the parents v of the scored
    proposals v+ (``node_id``); a record is kept iff every strict ancestor of its v was expanded too.
    This drops the requests BFS places below the rejection child of a node whose own request it
    deferred (§3.2). Order is preserved.
    """
    expanded: dict[tuple[str, str | None, int], set[int]] = {}
    for r in records:
        if not is_accept_child(r.node_id):
            raise ValueError(
                f"record (prompt {r.prompt_id}, call {r.call_index}) has node_id {r.node_id}: node_id must be "
                "the heap index of an acceptance child v+ (odd)"
            )
        expanded.setdefault((r.prompt_id, r.traversal, r.call_index), set()).add(parent_of(r.node_id))
    return [r for r in records
            if ancestors_in(parent_of(r.node_id), expanded[(r.prompt_id, r.traversal, r.call_index)])]


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

SAMPLER_FEATURES = frozenset(BUILTIN_FEATURES) | {"cut", *LIKELIHOOD_FEATURES, *ENTROPY_FEATURES, *RATIO_FEATURES}
"""The values forerun's samplers know about a candidate before its request (`traversal.CandidateNode.values`, the
root state's cut statistics): a classifier used by `forerun sample` / `eval` may read only these.  (The library
takes any feature whose values its caller supplies, e.g. `predictive_plan(depth_features=...)`.)"""

_TREE = ("parent_cut", "cut_gap", "depth", "accepts_on_path")
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "1": ("cut_fraction",),
    "2": _TREE,
    "3": LIKELIHOOD_FEATURES,
    "4": ENTROPY_FEATURES,
    "1+2": ("cut_fraction", *_TREE),
    "1+3": ("cut_fraction", *LIKELIHOOD_FEATURES),
    "1-3": ("cut_fraction", *_TREE, *LIKELIHOOD_FEATURES),
    "1-4": ("cut_fraction", *_TREE, *LIKELIHOOD_FEATURES, *ENTROPY_FEATURES),
}
"""Feature sets of App. E.7 (labels as in its Figure 18).  The samplers write every one of them into each
record; Feature 4 needs the per-token entropy (absent where the backend does not report it)."""

POST_GENERATION_FIELDS = frozenset({"accept_prob", "log_accept", "accepted", "realized", "certainty_class"})
"""Record fields known only after the proposal is generated and scored: never features."""

TREE_POSITION_FEATURES = frozenset({"parent_cut", "cut_gap", "accepts_on_path"})
"""Features that read the node's place in the tree (κ(v), the accepts on its path), not only its depth:
a model using one needs the planner's DP over (depth, κ, accepts) (`plan_prefetch(tree_position=True)`)."""


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
            X[i] = feature_vector(names, record.values())
        except ValueError as exc:
            raise ValueError(
                f"record {i} (prompt {record.prompt_id}, call {record.call_index}, node {record.node_id}): {exc}"
            ) from None
    return X
