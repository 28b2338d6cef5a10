"""What "the identical chain" means when a test compares two runs of a sampler (sequential vs PreSTO, engine vs
server, cached vs uncached): the same response token ids, the same accept/reject decision at every MH step, and
the final state's per-position log q_τ, log p0 and entropy equal bit for bit (the MH ratio is computed from
them, so a last-bit difference is a different chain in waiting)."""

from __future__ import annotations

from typing import Any

import numpy as np


def assert_same_chain(a: Any, b: Any, label: Any = "") -> None:
    """Fail with `label` unless the two ChainResults are the same chain (see module doc)."""
    assert a.response_ids == b.response_ids, f"{label}: responses differ"
    assert a.history == b.history, f"{label}: accept/reject histories differ"
    for name in ("logq", "logp0", "entropy"):
        # NaN marks a quantity the sampler did not ask for (the entropy for PowerMH on a server): equal if both
        assert np.array_equal(getattr(a.state, name), getattr(b.state, name), equal_nan=True), \
            f"{label}: final {name} differs"
