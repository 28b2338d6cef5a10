"""Synthetic scored-node records for the certainty-classifier tests (a test double)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..classifiers.features import CLASSES, DEFAULT_EPSILON, NodeRecord, class_index


def synthetic_node_records(
    n_prompts: int = 8,
    calls_per_prompt: int = 5,
    nodes_per_call: int = 8,
    *,
    horizon: int = 64,
    epsilon: float = DEFAULT_EPSILON,
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
    records: list[NodeRecord] = []
    for p in range(n_prompts):
        for call in range(calls_per_prompt):
            kappa_of: dict[int, int] = {0: horizon}  # κ(v), the known cut of each node
            accepts_of: dict[int, int] = {0: 0}
            for node in range(nodes_per_call):
                depth = (node + 1).bit_length() - 1
                kappa = kappa_of[node]
                accepts = accepts_of[node]
                cut = min(int(rng.integers(0, horizon)), kappa)  # a feasible request (Condition 1)
                kappa_of[2 * node + 1], kappa_of[2 * node + 2] = cut, kappa
                accepts_of[2 * node + 1], accepts_of[2 * node + 2] = accepts + 1, accepts
                frac = cut / horizon
                label, a = _draw_class(rng, frac, allowed, signal, epsilon)
                records.append(
                    NodeRecord(
                        prompt_id=f"p{p}",
                        call_index=call,
                        node_id=2 * node + 1,
                        depth=depth,
                        cut=cut,
                        parent_cut=kappa,
                        cut_fraction=frac,
                        accepts_on_path=accepts,
                        accept_prob=a,
                        certainty_class=CLASSES[label],
                        realized=bool(rng.random() < 0.5),
                        extra={"loglik_mean": float(rng.normal())},
                    )
                )
    return records


def _draw_class(rng: np.random.Generator, frac: float, allowed: Sequence[int], signal: float,
                epsilon: float) -> tuple[int, float]:
    """(class index, acceptance probability in that class's range) for a node with cut fraction `frac`."""
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
