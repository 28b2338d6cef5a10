"""Synthetic scored-node records for the certainty-classifier tests (a test double)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..classifiers.features import class_index
from ..programs.acceptance import CLASSES, EPSILON
from ..programs.prefetch_tree import accept_child, node_depth, reject_child
from ..programs.records import NodeRecord


def _labelled_accept_prob(rng: np.random.Generator, frac: float, signal: float, allowed: Sequence[int],
                          epsilon: float) -> tuple[int, float]:
    """A class index (late cuts lean to accept, early ones to reject) and an A inside that class."""
    logits = np.array([signal * (0.5 - frac), signal * (frac - 0.5), -0.3])
    logits = np.where(np.isin(np.arange(3), allowed), logits, -np.inf)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    label = int(rng.choice(3, p=probs))
    if label == 0:
        return label, float(rng.uniform(0.0, epsilon))
    if label == 1:
        return label, float(rng.uniform(1.0 - epsilon, 1.0))
    return label, float(rng.uniform(epsilon * 1.01, 1.0 - epsilon * 1.01))


def _call_records(rng: np.random.Generator, prompt: str, call: int, nodes: int, horizon: int, signal: float,
                  allowed: Sequence[int], epsilon: float) -> list[NodeRecord]:
    """One call expanding heap nodes 0..nodes-1, with κ and accepts following the tree conventions."""
    kappa_of: dict[int, int] = {0: horizon}  # κ(v), the known cut of each node
    accepts_of: dict[int, int] = {0: 0}
    out = []
    for node in range(nodes):
        kappa, accepts = kappa_of[node], accepts_of[node]
        cut = min(int(rng.integers(0, horizon)), kappa)  # a feasible request (Condition 1)
        kappa_of[accept_child(node)], kappa_of[reject_child(node)] = cut, kappa
        accepts_of[accept_child(node)], accepts_of[reject_child(node)] = accepts + 1, accepts
        frac = cut / horizon
        label, a = _labelled_accept_prob(rng, frac, signal, allowed, epsilon)
        out.append(NodeRecord(
            prompt_id=prompt, call_index=call, node_id=accept_child(node), depth=node_depth(node), cut=cut,
            parent_cut=kappa, cut_fraction=frac, accepts_on_path=accepts, accept_prob=a,
            certainty_class=CLASSES[label], realized=bool(rng.random() < 0.5),
            extra={"loglik_mean": float(rng.normal())},
        ))
    return out


def synthetic_node_records(
    n_prompts: int = 8,
    calls_per_prompt: int = 5,
    nodes_per_call: int = 8,
    *,
    horizon: int = 64,
    epsilon: float = EPSILON,
    signal: float = 3.0,
    seed: int = 0,
    classes: Sequence[str] = CLASSES,
) -> list[NodeRecord]:
    """Synthetic scored-node records whose class depends on the cut fraction.

    Late cuts (c_j / T near 1, a short resampled suffix) lean to ε-certain accept, early cuts to
    ε-certain reject, with uncertain in between; ``signal`` scales how strongly (0: no signal).
    Only the listed ``classes`` occur. Each call expands heap nodes 0..nodes_per_call-1 (node_id is
    the proposal 2i+1); depth, cuts and accepts on the path follow the shared conventions
    (κ(root) = T).
    """
    if n_prompts < 1 or calls_per_prompt < 1 or nodes_per_call < 1:
        raise ValueError("n_prompts, calls_per_prompt and nodes_per_call must be positive")
    if horizon < 2:
        raise ValueError(f"horizon must be at least 2, got {horizon}")
    allowed = [class_index(c) for c in classes]
    if not allowed:
        raise ValueError("classes must not be empty")
    rng = np.random.default_rng(seed)
    return [record for p in range(n_prompts) for call in range(calls_per_prompt)
            for record in _call_records(rng, f"p{p}", call, nodes_per_call, horizon, signal, allowed, epsilon)]
