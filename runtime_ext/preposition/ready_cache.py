"""Ready-distribution cache, confidence gate and invalidation (pre-positioning paper §2.4, §3.3, §3.6).

A session's persistent token state and its ready distribution live behind **one lock**: every mutation
(append, sliding-window shift, rollback, update past the entry, close) clears the cached distribution in
the same critical section that changes the tokens, never lazily at serve time (§3.6).  Eligibility and the
gate are read under the same lock, so no interleaving lets a request see a distribution that the current
state would not reproduce.

    paper                               code
    n_s  (live end)                     SessionState.live_end
    t    (state version)                SessionState.version
    E, L_entry                          ReadyDistribution.entry_ids, .entry_len
    p = n_s + L_entry          (Eq. 1)  ReadyDistribution.decision_point
    ℓ_ready                             ReadyDistribution.logits (optional) / .top_ids, .top_logits
    ℓ(1), ℓ(2)                          top_two(logits)
    γ = ℓ(1) − ℓ(2)           (Eq. 11)  logit_gap / ReadyDistribution.logit_gap
    â = argmax ℓ                        ReadyDistribution.top_token
    τ                                   GateConfig.threshold
    A  (fast-answer set)                GateConfig.fast_answer_set
    gate: γ > τ ∧ â ∈ A       (Eq. 12)  gate_fires
    decoded, valid                      ReadySlot.decoded, ReadySlot.valid
    h  (hit rate), w = 1 − h  (Eq. 8)   PrepositionCounters.hit_rate, .wasted_fraction

Top-2 log-probabilities give the same gap as the raw logits: log-softmax subtracts one constant
(log Σ exp ℓ) from every logit, which cancels in ℓ(1) − ℓ(2).  That is what lets the SGLang server, which
returns `top_logprobs_num=2` log-probabilities rather than logits, feed the gate unchanged.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Literal, Sequence

import numpy as np

MatchKind = Literal["exact", "relaxed", "prefix", "none"]
"""How a request's realized entry relates to the pre-positioned entry E:
exact   — identical token for token (fast-path eligible, zero added risk);
relaxed — the streaming ad-hoc case: the realized entry ends with the assistant header the pre-position
          ended with (fast-path eligible; the served token is question-independent, risk r(τ));
prefix  — the realized entry extends E (E is pre-paid; fall through with Δ = len(realized) − L_entry);
none    — no valid ready distribution, or the entry differs (fall through / cold)."""


# ----------------------------------------------------------------------------------------------------
# gate math (pure)
# ----------------------------------------------------------------------------------------------------
def top_two(logits: np.ndarray) -> tuple[int, float, int, float]:
    """Argmax and runner-up of a logit vector: (id1, ℓ(1), id2, ℓ(2)) (Algorithm 2, line 4).

    Two O(|V|) passes: the vocabulary scan T_scan(V) of Eq. 3.
    """
    v = np.asarray(logits, dtype=np.float64).reshape(-1)
    if v.size < 2:
        raise ValueError(f"logits must hold at least 2 entries, got {v.size}")
    if np.isnan(v).any():
        raise ValueError("logits contain NaN")
    a = int(np.argmax(v))  # lowest id among ties, as numpy and the engines' greedy sampling
    rest = v.copy()
    rest[a] = -np.inf
    b = int(np.argmax(rest))
    return a, float(v[a]), b, float(v[b])


def logit_gap(logits: np.ndarray) -> float:
    """γ = ℓ(1) − ℓ(2), the top-1 to top-2 logit gap of the ready distribution (Eq. 11)."""
    _, l1, _, l2 = top_two(logits)
    return l1 - l2


def gap_from_top_logprobs(top_logprobs: Sequence[Sequence[Any]]) -> tuple[int, float]:
    """(â, γ) from SGLang-shaped top log-probabilities `[[logprob, id, text], ...]` (Eq. 11).

    log p(i) = ℓ_i − log Σ_j exp ℓ_j, so logprob differences equal logit differences.
    """
    if len(top_logprobs) < 2:
        raise ValueError(f"need the top-2 log-probabilities (top_logprobs_num >= 2), got {len(top_logprobs)}")
    entries = sorted(((float(e[0]), int(e[1])) for e in top_logprobs), key=lambda e: (-e[0], e[1]))
    (lp1, id1), (lp2, _) = entries[0], entries[1]
    if not (np.isfinite(lp1) and (np.isfinite(lp2) or lp2 == -np.inf)):
        raise ValueError(f"top log-probabilities must be finite, got {lp1}, {lp2}")
    return id1, lp1 - lp2


@dataclass(frozen=True)
class GateConfig:
    """The confidence gate of Eq. 12."""

    threshold: float = 2.0
    """τ: the gate fires only when γ > τ (paper default 2.0, inherited from the streaming companion)."""
    fast_answer_set: frozenset[int] | None = None
    """A: admissible single-token answers (token ids); None admits every token (A = V)."""

    def __post_init__(self) -> None:
        if not isinstance(self.threshold, (int, float)) or np.isnan(self.threshold):
            raise ValueError(f"threshold (τ) must be a number, got {self.threshold!r}")
        if self.fast_answer_set is not None:
            ids = frozenset(int(t) for t in self.fast_answer_set)
            if any(t < 0 for t in ids):
                raise ValueError("fast_answer_set (A) must hold non-negative token ids")
            object.__setattr__(self, "fast_answer_set", ids)


def gate_fires(gap: float, top_token: int, gate: GateConfig) -> bool:
    """Eq. 12: serve one cached token iff γ > τ and argmax(ℓ) ∈ A."""
    admissible = gate.fast_answer_set is None or int(top_token) in gate.fast_answer_set
    return bool(gap > gate.threshold) and admissible


# ----------------------------------------------------------------------------------------------------
# the cached distribution
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadyDistribution:
    """The output distribution at the decision point p, and exactly what it was computed from (§3.3)."""

    version: int
    """State version t the pre-position read (installation is refused if the state moved on)."""
    state_len: int
    """n_s at pre-position time."""
    entry_ids: tuple[int, ...]
    """E: the pre-positioned entry (query prefix + header, the generic header, or the tool envelope)."""
    computed_from: tuple[int, ...]
    """The exact token sequence x_{<p} (state ‖ E) whose last-position logits this is."""
    top_token: int
    """â = argmax ℓ_ready."""
    logit_gap: float
    """γ = ℓ(1) − ℓ(2) (Eq. 11)."""
    top_ids: tuple[int, ...] = ()
    """Top-k token ids (descending), when the engine returned them."""
    top_logits: tuple[float, ...] = ()
    """Their logits or log-probabilities (same differences)."""
    logits: np.ndarray | None = field(default=None, compare=False, repr=False)
    """Optional full logit vector ℓ_ready (one |V| vector; Algorithm 1 line 11)."""
    header_len: int = 0
    """Streaming only: the last `header_len` entry tokens are the assistant header that ad-hoc queries may
    match in the relaxed sense (0: exact match only)."""

    def __post_init__(self) -> None:
        if self.state_len < 0 or self.state_len + len(self.entry_ids) != len(self.computed_from):
            raise ValueError("computed_from must be the state (state_len tokens) followed by entry_ids")
        if tuple(self.computed_from[self.state_len:]) != tuple(self.entry_ids):
            raise ValueError("computed_from must end with entry_ids")
        if not 0 <= self.header_len <= len(self.entry_ids):
            raise ValueError(f"header_len must be in [0, L_entry={len(self.entry_ids)}], got {self.header_len}")
        if not np.isfinite(self.logit_gap) or self.logit_gap < 0:
            raise ValueError(f"logit_gap (γ) must be finite and >= 0, got {self.logit_gap}")

    @property
    def entry_len(self) -> int:
        """L_entry."""
        return len(self.entry_ids)

    @property
    def relaxable(self) -> bool:
        return self.header_len > 0

    @property
    def header_ids(self) -> tuple[int, ...]:
        return self.entry_ids[len(self.entry_ids) - self.header_len:] if self.header_len else ()

    @property
    def decision_point(self) -> int:
        """p = n_s + L_entry (Eq. 1)."""
        return self.state_len + len(self.entry_ids)

    def scan(self) -> tuple[int, float]:
        """(â, γ) for the serve (Algorithm 2, lines 4-5): a scan of ℓ_ready when it is kept, else the stored pair."""
        if self.logits is not None:
            a, l1, _, l2 = top_two(self.logits)
            return a, l1 - l2
        return self.top_token, self.logit_gap


def ready_from_logits(
    version: int, state: Sequence[int], entry: Sequence[int], logits: np.ndarray, *, keep_logits: bool = False,
    header_len: int = 0, top_k: int = 2,
) -> ReadyDistribution:
    """Build the record of Algorithm 1, lines 9-12, from a full logit vector."""
    v = np.asarray(logits, dtype=np.float64).reshape(-1)
    a, l1, b, l2 = top_two(v)
    k = min(max(top_k, 2), v.size)
    order = np.argsort(-v, kind="stable")[:k]
    return ReadyDistribution(
        version=version, state_len=len(state), entry_ids=tuple(int(t) for t in entry),
        computed_from=tuple(int(t) for t in state) + tuple(int(t) for t in entry),
        top_token=a, logit_gap=l1 - l2, top_ids=tuple(int(i) for i in order),
        top_logits=tuple(float(v[i]) for i in order), logits=v.copy() if keep_logits else None, header_len=header_len,
    )


def ready_from_top_logprobs(
    version: int, state: Sequence[int], entry: Sequence[int], top_logprobs: Sequence[Sequence[Any]], *,
    header_len: int = 0,
) -> ReadyDistribution:
    """Build the record from SGLang's `output_top_logprobs[0]` (the server path: `top_logprobs_num=2`)."""
    a, gap = gap_from_top_logprobs(top_logprobs)
    entries = sorted(((float(e[0]), int(e[1])) for e in top_logprobs), key=lambda e: (-e[0], e[1]))
    return ReadyDistribution(
        version=version, state_len=len(state), entry_ids=tuple(int(t) for t in entry),
        computed_from=tuple(int(t) for t in state) + tuple(int(t) for t in entry),
        top_token=a, logit_gap=gap, top_ids=tuple(i for _, i in entries), top_logits=tuple(lp for lp, _ in entries),
        header_len=header_len,
    )


def match_entry(ready: ReadyDistribution, realized_entry: Sequence[int], *, allow_relaxed: bool) -> MatchKind:
    """Eligibility of Algorithm 2, line 1 (state equality is checked by the caller through the version)."""
    r = tuple(realized_entry)
    e = ready.entry_ids
    if r == e:
        return "exact"
    h = ready.header_ids
    if allow_relaxed and h and len(r) >= len(h) and r[len(r) - len(h):] == h:
        return "relaxed"
    if len(r) > len(e) and r[: len(e)] == e:
        return "prefix"
    return "none"


# ----------------------------------------------------------------------------------------------------
# counters
# ----------------------------------------------------------------------------------------------------
@dataclass
class PrepositionCounters:
    """Pre-position and serve counters (Algorithm 1/2, Eq. 8).  Mutated only under the session lock.

    Invariant (checked by `check`): started = installed + discarded + in flight, and
    installed = consumed + invalidated + (1 if a valid unconsumed distribution is held).
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
    """Installed pre-positions read by at least one request before invalidation (hits)."""
    invalidated: int = 0
    """Installed pre-positions cleared by a mutation before any request read them (wasted)."""
    served_fast: int = 0
    """Requests answered from the cache with an exact entry match (Eq. 3)."""
    served_fast_relaxed: int = 0
    """Streaming ad-hoc requests answered with the question-independent header token (relaxed match)."""
    fell_through: int = 0
    """Requests that found a valid pre-position but took the normal path (gate not met or entry differs)."""
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


# ----------------------------------------------------------------------------------------------------
# the session state + its ready slot, one lock
# ----------------------------------------------------------------------------------------------------
class SessionClosed(RuntimeError):
    """An operation on a closed session."""


@dataclass
class ReadySlot:
    """The per-session fields of Algorithm 1 (position, dist, decoded, valid) plus bookkeeping."""

    ready: ReadyDistribution | None = None
    decoded: bool = False
    valid: bool = False
    consumed: bool = False


@dataclass(frozen=True)
class Lookup:
    """What a request saw, atomically, when it consulted the cache (Algorithm 2, line 1)."""

    match: MatchKind
    ready: ReadyDistribution | None
    """The valid distribution held (also when the entry does not match: Algorithm 2 then falls through)."""
    version: int
    state: tuple[int, ...]
    """The session's tokens at the moment of the lookup (x_{<n_s}); the serve's ground truth."""


class SessionState:
    """A session's persistent token state (frozen system region ‖ data or turns), version and ready slot.

    Every public mutation takes `lock`, changes the tokens, bumps `version` and clears the ready slot in
    one critical section (§3.6).  The lock is re-entrant so that callers can group a mutation with their
    own bookkeeping.
    """

    def __init__(self, tokens: Iterable[int] = (), *, frozen_len: int | None = None) -> None:
        self.lock = threading.RLock()
        self._tokens: list[int] = [int(t) for t in tokens]
        if any(t < 0 for t in self._tokens):
            raise ValueError("token ids must be non-negative")
        self.frozen_len = len(self._tokens) if frozen_len is None else int(frozen_len)
        if not 0 <= self.frozen_len <= len(self._tokens):
            raise ValueError(f"frozen_len must be in [0, {len(self._tokens)}], got {frozen_len}")
        self.version = 0
        self.closed = False
        self.slot = ReadySlot()
        self.counters = PrepositionCounters()
        self.in_flight = 0
        self.invalidation_log: Counter[str] = Counter()
        """Why held distributions were cleared (append, shift, rollback, close, superseded) -> count."""

    # -- reads ----------------------------------------------------------------------------------------
    @property
    def live_end(self) -> int:
        """n_s."""
        with self.lock:
            return len(self._tokens)

    def snapshot(self) -> tuple[int, tuple[int, ...]]:
        """(version, tokens) read atomically."""
        with self.lock:
            self._check_open()
            return self.version, tuple(self._tokens)

    @property
    def tokens(self) -> tuple[int, ...]:
        with self.lock:
            return tuple(self._tokens)

    # -- mutations (each invalidates in the same critical section) ---------------------------------
    def append(self, ids: Sequence[int]) -> int:
        """Commit an update (data batch, turn, tool call) at the live end; returns the new version."""
        ids = [int(t) for t in ids]
        if any(t < 0 for t in ids):
            raise ValueError("token ids must be non-negative")
        with self.lock:
            self._check_open()
            self._tokens.extend(ids)
            return self._mutated("append")

    def shift_window(self, n_drop: int) -> int:
        """Sliding-window shift: drop the oldest `n_drop` tokens after the frozen system region."""
        with self.lock:
            self._check_open()
            movable = len(self._tokens) - self.frozen_len
            if not 0 < n_drop <= movable:
                raise ValueError(f"n_drop must be in [1, {movable}] (tokens after the frozen region), got {n_drop}")
            del self._tokens[self.frozen_len : self.frozen_len + n_drop]
            return self._mutated("shift")

    def rollback(self, n: int) -> int:
        """Discard the last `n` committed tokens (never into the frozen region)."""
        with self.lock:
            self._check_open()
            movable = len(self._tokens) - self.frozen_len
            if not 0 < n <= movable:
                raise ValueError(f"rollback n must be in [1, {movable}] (tokens after the frozen region), got {n}")
            del self._tokens[len(self._tokens) - n :]
            return self._mutated("rollback")

    def close(self) -> None:
        """End the session; the ready distribution is cleared and every later operation raises."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.version += 1
            self._invalidate("close")

    # -- the ready slot ------------------------------------------------------------------------------
    def begin_preposition(self) -> None:
        with self.lock:
            self._check_open()
            self.counters.started += 1
            self.in_flight += 1

    def install(self, ready: ReadyDistribution) -> bool:
        """Record a finished pre-position (Algorithm 1 lines 9-12) iff the state is still the one it read."""
        with self.lock:
            self.in_flight -= 1
            current = not self.closed and ready.version == self.version and ready.state_len == len(self._tokens)
            if not current:
                self.counters.discarded += 1
                return False
            if tuple(self._tokens) != ready.computed_from[: ready.state_len]:
                raise AssertionError("version matched but tokens differ: a mutation bypassed SessionState")
            if self.slot.valid and not self.slot.consumed:
                self.counters.invalidated += 1  # superseded before use
                self.invalidation_log["superseded"] += 1
            self.slot = ReadySlot(ready=ready, decoded=True, valid=True, consumed=False)
            self.counters.installed += 1
            return True

    def abort_preposition(self) -> None:
        """A launched pre-position failed or was cancelled (counted as discarded)."""
        with self.lock:
            self.in_flight -= 1
            self.counters.discarded += 1

    def record_skip(self) -> None:
        with self.lock:
            self.counters.skipped += 1

    def lookup(self, realized_entry: Sequence[int], *, allow_relaxed: bool = False) -> Lookup:
        """Eligibility check (Algorithm 2, line 1), atomically with the state it is checked against.

        Marks the pre-position consumed (a hit) when the request can use it: an exact or relaxed match
        reads the distribution, a prefix match restores the pre-paid entry.
        """
        with self.lock:
            self._check_open()
            slot = self.slot
            if not (slot.valid and slot.decoded and slot.ready is not None and slot.ready.version == self.version):
                return Lookup("none", None, self.version, tuple(self._tokens))
            kind = match_entry(slot.ready, realized_entry, allow_relaxed=allow_relaxed)
            if kind != "none" and not slot.consumed:
                slot.consumed = True
                self.counters.consumed += 1
            return Lookup(kind, slot.ready, self.version, tuple(self._tokens))

    def count(self, name: str) -> None:
        """Increment one serve counter under the lock."""
        with self.lock:
            setattr(self.counters, name, getattr(self.counters, name) + 1)

    def check_counters(self) -> None:
        """Raise AssertionError unless the pre-position counters add up (see PrepositionCounters)."""
        with self.lock:
            c = self.counters
            if c.started != c.installed + c.discarded + self.in_flight:
                raise AssertionError(f"started {c.started} != installed {c.installed} + discarded {c.discarded} + in flight {self.in_flight}")
            held = 1 if (self.slot.valid and not self.slot.consumed) else 0
            if c.installed != c.consumed + c.invalidated + held:
                raise AssertionError(f"installed {c.installed} != consumed {c.consumed} + invalidated {c.invalidated} + held {held}")

    # -- internals -----------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise SessionClosed("session is closed")

    def _mutated(self, reason: str) -> int:
        self.version += 1
        self._invalidate(reason)
        return self.version

    def _invalidate(self, reason: str) -> None:
        """Clear decoded and valid (§3.6).  Called with the lock held, inside the mutation."""
        slot = self.slot
        if slot.valid:
            if not slot.consumed:
                self.counters.invalidated += 1
            self.invalidation_log[reason] += 1
        self.slot = ReadySlot()
