"""A streaming market-trend task that exercises the confidence gate honestly (pre-positioning paper §5, HW-3).

Synthetic price windows with a known direction are streamed into a session, one window per session (one
canonical query per non-overlapping window, as the paper's calibration).  After each window is committed
the session pre-positions the generic assistant header (no question in context yet: the served token is
question-independent); then the canonical question "Is the trend up or down?" runs the model's full path.
Each window gives one measured pair (logit gap γ, argmax ∈ A, cached token == full-path token), the input
of the τ sweep in `calibration`, plus ground-truth accuracy of both tokens.  τ for r ≤ r_max is picked on
one half of the windows and judged on the other (`SPLIT`): a τ judged on the windows it was picked on
reports an optimistic coverage and false-accept rate.

    paper                                  code
    data window                            TrendWindow.prices
    canonical query                        QUESTION
    fast-answer set A (answer tokens)      answer_tokens(tokenizer)
    γ, â (ready distribution)              TrendPair.logit_gap, .fast_token
    model's own full-path output           TrendPair.full_token
    served token wrong (Eq. 14)            TrendPair.fast_token != TrendPair.full_token
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Literal, Sequence, TypeVar

import numpy as np

from .calibration import (GatePair, GatePoint, HeldOutCalibration, calibrate_held_out, first_token_labels,
                          gap_quantiles, gate_point, sweep_threshold)
from .drawn import DrawnSequence
from ...programs.sessions import SessionFormat, StreamingSession
from ...runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
from ...runtime_ext.preposition.gate import GateConfig

Direction = Literal["up", "down"]
T = TypeVar("T")

SYSTEM = ("You monitor a stock price stream. After each batch of prices, answer whether the trend is up or down "
          "with one word: up or down.")
QUESTION = "Is the trend up or down?"
ANSWER_WORDS: dict[str, tuple[str, ...]] = {
    "up": ("up", "Up", "UP", "upward", "Upward", "rising", "Rising", "increasing", "Increasing"),
    "down": ("down", "Down", "DOWN", "downward", "Downward", "falling", "Falling", "decreasing", "Decreasing"),
}


@dataclass(frozen=True)
class TrendWindow:
    """One non-overlapping price window with its ground-truth direction."""

    prices: tuple[float, ...]
    direction: Direction

    def text(self) -> str:
        return ", ".join(f"{p:.2f}" for p in self.prices)


def make_windows(n: int, length: int = 12, *, seed: int = 0, drift: float = 1.0, noise: float = 0.4
                 ) -> list[TrendWindow]:
    """`n` windows of `length` prices: a random walk with drift ±`drift` per step and N(0, noise²) steps.

    The direction is drawn uniformly; the least-squares slope of every window agrees with it (checked).
    """
    return list(drawn_windows(n, length, seed=seed, drift=drift, noise=noise))


def drawn_windows(n: int, length: int = 12, *, seed: int = 0, drift: float = 1.0, noise: float = 0.4
                  ) -> DrawnSequence[TrendWindow]:
    """`make_windows`'s windows, each drawn when a run first reaches it (`DrawnSequence`)."""
    if n < 1 or length < 2:
        raise ValueError(f"need n >= 1 and length >= 2, got n={n}, length={length}")
    if drift <= 0 or noise < 0:
        raise ValueError(f"need drift > 0 and noise >= 0, got drift={drift}, noise={noise}")
    return DrawnSequence(n, lambda: _drawn_windows(n, length, seed, drift, noise))


def _drawn_windows(n: int, length: int, seed: int, drift: float, noise: float) -> Iterator[TrendWindow]:
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    drawn = 0
    while drawn < n:
        sign = 1.0 if rng.random() < 0.5 else -1.0
        start = rng.uniform(50, 150)
        prices = start + np.cumsum(np.concatenate([[0.0], sign * drift + rng.normal(0, noise, length - 1)]))
        slope = np.polyfit(t, prices, 1)[0]
        if np.sign(slope) != sign:
            continue  # noise reversed the visible trend: not an unambiguous window
        drawn += 1
        yield TrendWindow(tuple(float(p) for p in prices), "up" if sign > 0 else "down")


def answer_tokens(tokenizer: Any) -> dict[int, Direction]:
    """A: the first token of each answer word (with and without a leading space) -> its direction; a token
    that starts words of both directions is ambiguous and left out."""
    return first_token_labels(tokenizer, ANSWER_WORDS)  # type: ignore[return-value]


@dataclass(frozen=True)
class TrendPair:
    """One decision point: the ready distribution's token and gap, and the full path's token."""

    logit_gap: float
    fast_token: int
    in_answer_set: bool
    full_token: int
    truth: Direction
    fast_label: str | None
    full_label: str | None

    def gate_pair(self) -> GatePair:
        """Correct = the cached token equals the model's own full-path output (Eq. 14)."""
        return GatePair(self.logit_gap, self.in_answer_set, self.fast_token == self.full_token)


def collect_pairs(engine: Any, tokenizer: Any, windows: Sequence[TrendWindow], *,
                  progress: Callable[[], None] | None = None, answer_lead: str = "") -> list[TrendPair]:
    """Run the task: per window, pre-position the generic header, then ask the canonical question fully.

    `answer_lead` is appended to the assistant header (e.g. "The trend is"), so that the decision point
    sits right before the answer word rather than at the start of a free-form reply.
    """
    A = answer_tokens(tokenizer)
    base = SessionFormat()
    fmt = SessionFormat(header=base.header + answer_lead)
    # the gate never fires here: we record γ and â, and the full path answers every query
    pp = Prepositioner(engine, PrepositionConfig(gate=GateConfig(threshold=float("inf")), background=False),
                       tokenizer=tokenizer)
    pairs = []
    try:
        for w in windows:
            with StreamingSession(pp, tokenizer=tokenizer, system=SYSTEM, fmt=fmt, allow_relaxed=True) as s:
                s.append_data(w.text())
                ready = s.state.ready_for(s.header_ids())  # no standing query: the generic header alone
                if ready is None:
                    raise RuntimeError("the pre-position did not install (budget skip or engine failure)")
                full = s.ask(QUESTION)
                if full.path != "fall":
                    raise AssertionError(f"expected the full path, got {full.path}")
                pairs.append(TrendPair(
                    logit_gap=ready.logit_gap, fast_token=ready.top_token, in_answer_set=ready.top_token in A,
                    full_token=full.token_id, truth=w.direction, fast_label=A.get(ready.top_token),
                    full_label=A.get(full.token_id),
                ))
            if progress is not None:
                progress()
    finally:
        pp.close()
    return pairs


SPLIT = "alternate windows: positions 0, 2, 4, ... pick τ, positions 1, 3, 5, ... are held out to judge it"
"""How the trend windows (one seeded, i.i.d. set) are split between calibration and held-out judgement."""


def split_windows(items: Sequence[T]) -> tuple[list[T], list[T]]:
    """(calibration, held out) by `SPLIT`: disjoint positions of one seeded set; needs at least 2 items."""
    if len(items) < 2:
        raise ValueError(f"need at least 2 windows (one to pick τ on, one to judge it), got {len(items)}")
    return list(items[0::2]), list(items[1::2])


@dataclass(frozen=True)
class TrendReport:
    """Gate behaviour on the task: at the reference τ, and at τ picked on one half and judged on the other."""

    n: int
    answer_set_size: int
    at_tau: GatePoint
    """The reference τ on all n windows: τ is fixed before the windows are seen, so nothing here is in-sample."""
    calibration: HeldOutCalibration
    """τ for r ≤ r_max picked on the calibration windows; `held_out_at_calibrated` is the figure to read."""
    calibration_windows: int
    held_out_windows: int
    split: str
    """`SPLIT`: which windows pick τ and which judge it."""
    agreement: float
    """Fraction of windows where the question-independent token equals the full-path token."""
    full_accuracy: float
    """Full-path token's direction == ground truth."""
    fast_accuracy: float
    """Cached token's direction == ground truth."""
    gap_quantiles: tuple[float, float, float]
    """γ at the 10th, 50th and 90th percentile."""

    def as_dict(self) -> dict:
        out = asdict(self)
        out["calibration"] = self.calibration.as_dict()
        return out


def report(pairs: Sequence[TrendPair], *, tau: float = 2.0, r_max: float = 0.05, answer_set_size: int = 0
           ) -> tuple[TrendReport, list[GatePoint]]:
    """Coverage / false accept at τ on all windows; the smallest τ with r(τ) ≤ r_max picked on the calibration
    windows and judged on the held-out ones (`SPLIT`); the sweep over all windows (Figure 7's curve)."""
    gp = [p.gate_pair() for p in pairs]
    calib, held = split_windows(gp)
    gaps = np.array([p.logit_gap for p in pairs])
    rep = TrendReport(
        n=len(pairs), answer_set_size=answer_set_size, at_tau=gate_point(gp, tau),
        calibration=calibrate_held_out(calib, held, r_max=r_max, tau=tau),
        calibration_windows=len(calib), held_out_windows=len(held), split=SPLIT,
        agreement=float(np.mean([p.fast_token == p.full_token for p in pairs])),
        full_accuracy=float(np.mean([p.full_label == p.truth for p in pairs])),
        fast_accuracy=float(np.mean([p.fast_label == p.truth for p in pairs])),
        gap_quantiles=tuple(gap_quantiles(gaps)),  # type: ignore[arg-type]
    )
    return rep, sweep_threshold(gp)
