"""Ready-distribution cache and invalidation (pre-positioning paper §3.3, §3.6).

A session's persistent token state and its ready distributions live behind **one lock**: every mutation
(append, sliding-window shift, rollback, close) clears every cached distribution in the same critical
section that changes the tokens, never lazily at serve time (§3.6).  Eligibility is read under the same
lock, so no interleaving lets a request see a distribution that the current state would not reproduce.

One decision point can hold several ready distributions, one per pre-positioned entry: a streaming session's standing
queries (query prefix + header, each its own) and its question-independent generic header (§2.1, §3.4); an agentic
session's tool-result envelope and the realized entries of the results it expects (§3.5).  A request whose realized
entry equals one of them reads that one (exact match); an ad-hoc streaming query reads the header's (relaxed match,
role "header") and never another query's.

    paper                               code
    n_s  (live end)                     SessionState.live_end
    t    (state version)                SessionState.version
    E, L_entry                          ReadyDistribution.entry_ids, .entry_len
    p = n_s + L_entry          (Eq. 1)  ReadyDistribution.decision_point
    ℓ_ready                             ReadyDistribution.logits (optional) / .top_ids, .top_logits
    γ = ℓ(1) − ℓ(2)           (Eq. 11)  ReadyDistribution.logit_gap  (gate math: gate.py)
    â = argmax ℓ                        ReadyDistribution.top_token
    decoded ∧ valid                     the entry has a ReadySlot in SessionState (cleared on mutation)
    pre-paid entry KV                   ReadySlot.pin (engine pin handle, released on invalidation)
    h  (hit rate), w = 1 − h  (Eq. 8)   PrepositionCounters.hit_rate, .wasted_fraction
"""

from __future__ import annotations

import operator
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Sequence

import numpy as np

from .counters import PrepositionCounters
from .gate import gap_from_top_logprobs, top_two

MatchKind = Literal["exact", "relaxed", "prefix", "none"]
"""How a request's realized entry relates to the pre-positioned entries:
exact   — identical to one of them token for token (fast-path eligible, zero added risk);
relaxed — the streaming ad-hoc case: it ends with the pre-positioned generic header (role "header"); the
          served token is the header's question-independent one (risk r(τ));
prefix  — it extends a pre-positioned entry E (E is pre-paid; fall through with Δ = len(realized) − L_entry);
none    — no valid ready distribution matches (fall through / cold)."""

Role = Literal["entry", "header"]
"""entry: served on an exact match only; header: the generic header, also read by relaxed matches."""


def token_ids(values: Any, name: str = "ids") -> tuple[int, ...]:
    """Validated token ids: a sequence of non-negative integers (not a string, not strings, not bools)."""
    if isinstance(values, (str, bytes, bytearray)):
        raise ValueError(f"{name} must be a sequence of integer token ids, got a string {values!r:.40}")
    out = []
    for t in values:
        if not isinstance(t, (int, np.integer)) or isinstance(t, (bool, np.bool_)):
            raise ValueError(f"{name} must be integer token ids, got {t!r} ({type(t).__name__})")
        if t < 0:
            raise ValueError(f"{name}: token ids must be non-negative, got {t}")
        out.append(int(t))
    return tuple(out)


class SessionClosed(RuntimeError):
    """An operation on a closed session."""


class ContextOverflow(ValueError):
    """A mutation would leave no room in the context window; it was rejected before anything changed."""


class StateChanged(RuntimeError):
    """A commit expected the state at one version and found another (a concurrent mutation)."""


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
    """E: the pre-positioned entry (query prefix + header, the generic header, or a tool envelope)."""
    computed_from: tuple[int, ...]
    """The exact token sequence x_{<p} (state ‖ E) whose last-position logits this is."""
    top_token: int
    """â = argmax ℓ_ready."""
    logit_gap: float
    """γ = ℓ(1) − ℓ(2) (Eq. 11); +inf when ℓ(2) = −inf (the runner-up is impossible: the gate fires for any finite τ)."""
    top_ids: tuple[int, ...] = ()
    """Top-k token ids (descending), when the engine returned them."""
    top_logits: tuple[float, ...] = ()
    """Their logits or log-probabilities (same differences)."""
    logits: np.ndarray | None = field(default=None, compare=False, repr=False)
    """Optional full logit vector ℓ_ready (one |V| vector; Algorithm 1 line 11)."""
    role: Role = "entry"
    """"header": the question-independent generic header that relaxed (ad-hoc) matches read."""

    def __post_init__(self) -> None:
        if self.state_len < 0 or self.state_len + len(self.entry_ids) != len(self.computed_from):
            raise ValueError("computed_from must be the state (state_len tokens) followed by entry_ids")
        if tuple(self.computed_from[self.state_len:]) != tuple(self.entry_ids):
            raise ValueError("computed_from must end with entry_ids")
        if not self.entry_ids:
            raise ValueError("entry_ids must hold at least one token")
        if self.role not in ("entry", "header"):
            raise ValueError(f"role must be 'entry' or 'header', got {self.role!r}")
        if np.isnan(self.logit_gap) or self.logit_gap < 0:
            raise ValueError(f"logit_gap (γ) must be >= 0 (+inf: the runner-up is impossible), got {self.logit_gap}")

    @property
    def entry_len(self) -> int:
        """L_entry."""
        return len(self.entry_ids)

    @property
    def relaxable(self) -> bool:
        return self.role == "header"

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
    role: Role = "entry", top_k: int = 2,
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
        top_logits=tuple(float(v[i]) for i in order), logits=v.copy() if keep_logits else None, role=role,
    )


def ready_from_top_logprobs(
    version: int, state: Sequence[int], entry: Sequence[int], top_logprobs: Sequence[Sequence[Any]], *,
    role: Role = "entry",
) -> ReadyDistribution:
    """Build the record from SGLang's `output_top_logprobs[0]` (the server path: `top_logprobs_num=2`)."""
    a, gap = gap_from_top_logprobs(top_logprobs)
    entries = sorted(((float(e[0]), int(e[1])) for e in top_logprobs), key=lambda e: (-e[0], e[1]))
    return ReadyDistribution(
        version=version, state_len=len(state), entry_ids=tuple(int(t) for t in entry),
        computed_from=tuple(int(t) for t in state) + tuple(int(t) for t in entry),
        top_token=a, logit_gap=gap, top_ids=tuple(i for _, i in entries), top_logits=tuple(lp for lp, _ in entries),
        role=role,
    )


def match_entry(ready: ReadyDistribution, realized_entry: Sequence[int], *, allow_relaxed: bool) -> MatchKind:
    """How `realized_entry` relates to one pre-positioned entry (state equality is the caller's: the version)."""
    r = tuple(realized_entry)
    e = ready.entry_ids
    if r == e:
        return "exact"
    if allow_relaxed and ready.relaxable and len(r) > len(e) and r[len(r) - len(e):] == e:
        return "relaxed"
    if len(r) > len(e) and r[: len(e)] == e:
        return "prefix"
    return "none"


# ----------------------------------------------------------------------------------------------------
# the session state + its ready slots, one lock
# ----------------------------------------------------------------------------------------------------
@dataclass
class ReadySlot:
    """One decoded and valid pre-position (Algorithm 1's position, dist, decoded, valid) plus bookkeeping."""

    ready: ReadyDistribution
    consumed: bool = False
    pin: Any = None
    """The engine pin handle that keeps state ‖ E resident (the pre-paid entry), released on invalidation."""


@dataclass(frozen=True)
class Lookup:
    """What a request saw, atomically, when it consulted the cache (Algorithm 2, line 1)."""

    match: MatchKind
    ready: ReadyDistribution | None
    """The distribution matched (exact: its own; relaxed: the header's; prefix: the pre-paid entry's)."""
    version: int
    state: tuple[int, ...]
    """The session's tokens at the moment of the lookup (x_{<n_s}); the serve's ground truth."""
    prepaid: ReadyDistribution | None = None
    """Relaxed matches only: a pre-positioned entry the realized one extends (what a fall-through reuses)."""
    held: bool = False
    """Whether any valid pre-position was held (a mismatch then falls through, not cold)."""


class SessionState:
    """A session's persistent token state (frozen system region ‖ data or turns), version and ready slots.

    Every public mutation takes `lock`, checks that it can be served (`max_len`, `expect_version`), changes the
    tokens, bumps `version` and clears every ready slot in one critical section (§3.6).  A mutation is all-or-nothing:
    everything that can fail is checked before the first change, so one that raises left the tokens, the version, the
    slots and the counters as they were.  The lock is re-entrant: callers group a mutation with their bookkeeping.
    """

    def __init__(self, tokens: Iterable[int] = (), *, frozen_len: int | None = None, max_len: int | None = None) -> None:
        self.lock = threading.RLock()
        self._tokens: list[int] = list(token_ids(tokens, "tokens"))
        self.frozen_len = len(self._tokens) if frozen_len is None else int(frozen_len)
        if not 0 <= self.frozen_len <= len(self._tokens):
            raise ValueError(f"frozen_len must be in [0, {len(self._tokens)}], got {frozen_len}")
        if max_len is not None and len(self._tokens) >= max_len:
            raise ContextOverflow(f"the initial state ({len(self._tokens)} tokens) leaves no room in the context "
                                  f"window ({max_len} tokens)")
        self.max_len = max_len
        """Context window: no mutation may leave len(state) + its reserve above it (None: unbounded)."""
        self.version = 0
        self.closed = False
        self._slots: dict[tuple[int, ...], ReadySlot] = {}
        self.counters = PrepositionCounters()
        self.in_flight = 0
        self.invalidation_log: Counter[str] = Counter()
        """Why held distributions were cleared (append, shift, rollback, close, superseded) -> count."""
        self._released: list[Any] = []
        self._background_error: BaseException | None = None

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

    def held(self) -> list[ReadyDistribution]:
        """The valid ready distributions at the current version (in installation order)."""
        with self.lock:
            return [s.ready for s in self._slots.values()]

    def ready_for(self, entry: Sequence[int]) -> ReadyDistribution | None:
        """The valid ready distribution of exactly this entry, if held."""
        with self.lock:
            slot = self._slots.get(tuple(entry))
            return None if slot is None else slot.ready

    # -- mutations (each validated first, then invalidates in the same critical section) -------------
    def append(self, ids: Sequence[int], *, reserve: int = 0, expect_version: int | None = None,
               before_commit: Callable[[], None] | None = None) -> int:
        """Commit an update (data batch, turn, tool call) at the live end; returns the new version.

        Rejected before anything changes when len(state) + len(ids) + `reserve` exceeds `max_len` (the
        reserve: the entry and the token the next request needs), or when `expect_version` is given and
        the state is no longer at that version (the caller computed `ids` from an older state).
        `before_commit` runs under the lock after the checks and right before the tokens change (a turn
        records the serve it was built on there, before the commit clears that distribution); it must not
        raise.
        """
        ids = list(token_ids(ids))
        with self.lock:
            self._check_open()
            self._check_version(expect_version)
            self.check_append(len(ids), reserve=reserve)
            if before_commit is not None:
                before_commit()
            self._tokens.extend(ids)
            return self._mutated("append")

    def check_append(self, n: int, *, reserve: int = 0) -> None:
        """ContextOverflow unless `n` more tokens (+ `reserve`) fit: `append`'s own check, changing nothing."""
        with self.lock:
            self._check_open()
            need = len(self._tokens) + int(n) + max(int(reserve), 0)
            if self.max_len is not None and need > self.max_len:
                raise ContextOverflow(
                    f"appending {n} tokens to a {len(self._tokens)}-token state (+ {reserve} reserved for the "
                    f"next entry and answer) needs {need} > the context window {self.max_len}; nothing was committed")

    def after_shift(self, n_drop: int) -> tuple[int, ...]:
        """The tokens `shift_window(n_drop)` would leave (ValueError for a bad n_drop); changes nothing."""
        with self.lock:
            self._check_open()
            n = self._count(n_drop, "n_drop")
            return tuple(self._tokens[: self.frozen_len] + self._tokens[self.frozen_len + n :])

    def after_rollback(self, n: int) -> tuple[int, ...]:
        """The tokens `rollback(n)` would leave (ValueError for a bad n); changes nothing."""
        with self.lock:
            self._check_open()
            k = self._count(n, "rollback n")
            return tuple(self._tokens[: len(self._tokens) - k])

    def shift_window(self, n_drop: int, *, expect_version: int | None = None) -> int:
        """Sliding-window shift: drop the oldest `n_drop` tokens after the frozen system region."""
        with self.lock:
            self._check_open()
            self._check_version(expect_version)
            self._tokens[:] = self.after_shift(n_drop)
            return self._mutated("shift")

    def rollback(self, n: int, *, expect_version: int | None = None) -> int:
        """Discard the last `n` committed tokens (never into the frozen region)."""
        with self.lock:
            self._check_open()
            self._check_version(expect_version)
            self._tokens[:] = self.after_rollback(n)
            return self._mutated("rollback")

    def close(self) -> None:
        """End the session; the ready distributions are cleared and every later operation raises."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.version += 1
            self._invalidate("close")

    # -- the ready slots -----------------------------------------------------------------------------
    def begin_preposition(self) -> None:
        with self.lock:
            self._check_open()
            self.counters.started += 1
            self.in_flight += 1

    def install(self, ready: ReadyDistribution, *, pin: Any = None) -> bool:
        """Record a finished pre-position (Algorithm 1 lines 9-12) iff the state is still the one it read.

        A refused install hands its `pin` to `take_released_pins` (the caller unpins it there).
        """
        with self.lock:
            self.in_flight -= 1
            current = not self.closed and ready.version == self.version and ready.state_len == len(self._tokens)
            if not current:
                self.counters.discarded += 1
                if pin is not None:
                    self._released.append(pin)
                return False
            if tuple(self._tokens) != ready.computed_from[: ready.state_len]:
                raise AssertionError("version matched but tokens differ: a mutation bypassed SessionState")
            old = self._slots.pop(ready.entry_ids, None)
            if old is not None:
                self._drop(old, "superseded")
            self._slots[ready.entry_ids] = ReadySlot(ready=ready, pin=pin)
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

    def lookup(self, realized_entry: Sequence[int], *, allow_relaxed: bool = False, consume: bool = True) -> Lookup:
        """Eligibility check (Algorithm 2, line 1), atomically with the state it is checked against.

        Marks an exact or prefix match consumed (a hit: the request reads the distribution or restores
        the pre-paid entry) unless `consume` is False (the caller counts it with `consume` once the request
        has succeeded).  A relaxed match is consumed only when its token is served (`consume`).
        """
        realized = tuple(realized_entry)
        with self.lock:
            self._check_open()
            state = tuple(self._tokens)
            if not self._slots:
                return Lookup("none", None, self.version, state)
            exact = self._slots.get(realized)
            if exact is not None:
                if consume:
                    self._consume(exact)
                return Lookup("exact", exact.ready, self.version, state, held=True)
            kinds = [(match_entry(s.ready, realized, allow_relaxed=allow_relaxed), s) for s in self._slots.values()]
            prefix = max((s for k, s in kinds if k == "prefix"), key=lambda s: s.ready.entry_len, default=None)
            header = max((s for k, s in kinds if k == "relaxed"), key=lambda s: s.ready.entry_len, default=None)
            if header is not None:
                return Lookup("relaxed", header.ready, self.version, state,
                              prepaid=None if prefix is None else prefix.ready, held=True)
            if prefix is not None:
                if consume:
                    self._consume(prefix)
                return Lookup("prefix", prefix.ready, self.version, state, held=True)
            return Lookup("none", None, self.version, state, held=True)

    def consume(self, ready: ReadyDistribution) -> None:
        """Count a hit for `ready` if it is still the valid distribution of its entry (relaxed serves)."""
        with self.lock:
            slot = self._slots.get(ready.entry_ids)
            if slot is not None and slot.ready is ready:
                self._consume(slot)

    def count(self, name: str) -> None:
        """Increment one serve counter under the lock."""
        with self.lock:
            setattr(self.counters, name, getattr(self.counters, name) + 1)

    def take_released_pins(self) -> list[Any]:
        """Pin handles of invalidated or refused pre-positions, to unpin outside the lock (once each)."""
        with self.lock:
            out = list(self._released)
            self._released.clear()  # in place: pins_left_behind reads this list
            return out

    def pins_left_behind(self) -> Callable[[], list[Any]]:
        """The pins this session holds, listed without a reference to it: for a tracker to unpin once it is gone."""
        return lambda r=self._released, slots=self._slots: [*r, *(s.pin for s in slots.values() if s.pin is not None)]

    def record_background_error(self, exc: BaseException) -> None:
        """A background pre-position of this session failed: raised by this session's next call only."""
        with self.lock:
            if self._background_error is None:
                self._background_error = exc

    def take_background_error(self) -> BaseException | None:
        with self.lock:
            err, self._background_error = self._background_error, None
            return err

    def check_counters(self) -> None:
        """Raise AssertionError unless the pre-position counters add up (see PrepositionCounters)."""
        with self.lock:
            c = self.counters
            if c.started != c.installed + c.discarded + self.in_flight:
                raise AssertionError(f"started {c.started} != installed {c.installed} + discarded {c.discarded} + in flight {self.in_flight}")
            held = sum(1 for s in self._slots.values() if not s.consumed)
            if c.installed != c.consumed + c.invalidated + held:
                raise AssertionError(f"installed {c.installed} != consumed {c.consumed} + invalidated {c.invalidated} + held {held}")

    # -- internals -----------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise SessionClosed("session is closed")

    def _count(self, n: Any, name: str) -> int:
        """`n` as a count of movable tokens (after the frozen region), else ValueError."""
        movable = len(self._tokens) - self.frozen_len
        try:
            k = operator.index(n)
        except TypeError:
            k = None
        if k is None or isinstance(n, (bool, np.bool_)) or not 0 < k <= movable:
            raise ValueError(f"{name} must be in [1, {movable}] (tokens after the frozen region), got {n!r}")
        return int(k)

    def _check_version(self, expect_version: int | None) -> None:
        if expect_version is not None and expect_version != self.version:
            raise StateChanged(f"the session state moved from version {expect_version} to {self.version} "
                               "while this turn was computed; nothing was committed")

    def _consume(self, slot: ReadySlot) -> None:
        if not slot.consumed:
            slot.consumed = True
            self.counters.consumed += 1

    def _mutated(self, reason: str) -> int:
        self.version += 1
        self._invalidate(reason)
        return self.version

    def _drop(self, slot: ReadySlot, reason: str) -> None:
        if not slot.consumed:
            self.counters.invalidated += 1
        self.invalidation_log[reason] += 1
        if slot.pin is not None:
            self._released.append(slot.pin)

    def _invalidate(self, reason: str) -> None:
        """Clear decoded and valid of every slot (§3.6).  Called with the lock held, inside the mutation."""
        slots = list(self._slots.values())
        self._slots.clear()  # in place: pins_left_behind reads this dict
        for slot in slots:
            self._drop(slot, reason)
