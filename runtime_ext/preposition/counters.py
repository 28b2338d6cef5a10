"""Pre-position and serve counters of a session (pre-positioning paper Algorithm 1/2, Eq. 8).

    paper                       code
    h  (hit rate)     (Eq. 8)   PrepositionCounters.hit_rate
    w = 1 − h         (Eq. 8)   PrepositionCounters.wasted_fraction
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class PrepositionCounters:
    """Pre-position and serve counters (Algorithm 1/2, Eq. 8).  Mutated only under the session lock.

    Every pre-positioned entry counts on its own (a decision point may hold several).  Invariant (checked
    by `SessionState.check_counters`): started = installed + discarded + in flight, and
    installed = consumed + invalidated + (valid unconsumed distributions held).
    """

    started: int = 0
    """Pre-position forward passes launched (Algorithm 1 line 6)."""
    installed: int = 0
    """Pre-positions run to completion and recorded valid on the session ("pre-positions run")."""
    skipped: int = 0
    """Skipped because L_entry > B (Algorithm 1 lines 2-3)."""
    discarded: int = 0
    """Finished after the state had already moved on (never installed; wasted work)."""
    consumed: int = 0
    """Installed pre-positions used by at least one request before invalidation (hits): an exact match
    read it, a prefix match resumed from its pre-paid entry, or a relaxed match was served its token (a
    relaxed match whose gate did not fire is no hit: the header's KV is not a prefix of the request)."""
    invalidated: int = 0
    """Installed pre-positions cleared by a mutation before any request read them (wasted)."""
    served_fast: int = 0
    """Requests answered from the cache with an exact entry match (Eq. 3)."""
    served_fast_relaxed: int = 0
    """Streaming ad-hoc requests served the question-independent header token (relaxed match, gate fired)."""
    fell_through: int = 0
    """Requests that found a valid pre-position but took the normal path (gate not met, entry differs, or an
    answer of more than one token asked)."""
    cold: int = 0
    """Requests that found no valid pre-position (baseline path, Eq. 2)."""

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["hit_rate"] = self.hit_rate
        out["wasted_fraction"] = self.wasted_fraction
        return out

    def add(self, other: "PrepositionCounters") -> "PrepositionCounters":
        return PrepositionCounters(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    @property
    def hit_rate(self) -> float:
        """h (Eq. 8): consumed / resolved pre-positions, where resolved = consumed + invalidated + discarded
        (a pre-position whose state moved on before it finished is wasted too); NaN before any."""
        n = self.consumed + self.invalidated + self.discarded
        return self.consumed / n if n else float("nan")

    @property
    def wasted_fraction(self) -> float:
        """w = 1 − h (Eq. 8)."""
        h = self.hit_rate
        return 1.0 - h if h == h else float("nan")
