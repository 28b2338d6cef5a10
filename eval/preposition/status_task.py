"""A streaming status-feed task on which the default model's gate fires honestly (issue 10, item 10).

On the paper's market-trend task SmolLM2-135M never clears τ = 2 (it answers "The", or " up" whatever
the prices: `trend_task`).  Here the standing query asks for a property the small model *can* read off
the data state: the status field of the latest batch of a pump's telemetry.  The session's frozen region
holds the system prompt and eight worked examples (batch, question, "Status: <label>"); every live
window streams 1-4 batches; the standing query ends with the answer lead-in "Status:", so the decision
point sits right before the answer word.

Two decision points per window, both pre-positioned by the same update:
* exact   — the standing query's own entry (query prefix + header + lead-in): the served token is the
            model's own full-path token (zero added risk), so the gate is calibrated against the ground
            truth (served label == the latest batch's status);
* relaxed — the generic header + lead-in with no question (§2.1, the question-independent token): the
            paper's Eq. 14 risk, served token != the model's full-path token.

    paper                                  code
    data window                            StatusWindow.batches / .labels
    standing query, lead-in                QUESTION, LEAD
    fast-answer set A                      answer_tokens(tokenizer)
    γ, â (exact / relaxed)                 StatusPair.gap, .token / .header_gap, .header_token
    model's own full-path output           StatusPair.full_token
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterator, Sequence

import numpy as np

from .calibration import GatePair, first_token_labels
from .drawn import DrawnSequence
from ...programs.sessions import SessionFormat, StreamingSession
from ...runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
from ...runtime_ext.preposition.gate import GateConfig

SYSTEM = "You monitor a pump. Report the status of the latest data."
LABELS = ("up", "down")
QUESTION = "Latest status?"
LEAD = "Status:"
SHOT_LABELS = ("up", "down", "up", "up", "down", "up", "up", "down")
"""The worked examples' labels (this order: the arrangement matters to a 135M model; found by exploration)."""
ANSWER_WORDS = {"up": ("up", "Up", "UP"), "down": ("down", "Down", "DOWN")}


def batch_text(rng: np.random.Generator, label: str) -> str:
    """One telemetry batch: two readings (noise the model must skip) and the status field."""
    if label not in LABELS:
        raise ValueError(f"label must be one of {LABELS}, got {label!r}")
    return f"temperature={int(rng.integers(60, 130))}C pressure={int(rng.integers(1, 9))}bar status={label}"


def examples(seed: int = 1234) -> list[tuple[str, str]]:
    """The frozen few-shot history: per example a data batch, the question and the answer."""
    rng = np.random.default_rng(seed)
    fmt = SessionFormat()
    data_prefix = fmt.data.split("{data}")[0].split("\n", 1)[1]  # "New data: "
    out: list[tuple[str, str]] = []
    for label in SHOT_LABELS:
        out += [("user", data_prefix + batch_text(rng, label)), ("user", QUESTION), ("assistant", f"{LEAD} {label}")]
    return out


def session_format() -> SessionFormat:
    """ChatML with the answer lead-in after the assistant header."""
    base = SessionFormat()
    return SessionFormat(header=base.header + LEAD)


def status_session(pp: Prepositioner, tokenizer: Any, *, allow_relaxed: bool) -> StreamingSession:
    """A streaming session of the task: system + worked examples frozen, the standing query registered
    once the first batch is in (register it yourself with `register_query("status", QUESTION)`)."""
    return StreamingSession(pp, tokenizer=tokenizer, system=SYSTEM, fmt=session_format(),
                            allow_relaxed=allow_relaxed, history=examples())


@dataclass(frozen=True)
class StatusWindow:
    """One live window: the batches streamed since the last decision point and their status labels."""

    batches: tuple[str, ...]
    labels: tuple[str, ...]

    @property
    def truth(self) -> str:
        return self.labels[-1]


def make_windows(n: int, *, seed: int = 0, max_batches: int = 4,
                 exclude: Collection[StatusWindow] = ()) -> list[StatusWindow]:
    """`n` windows of 1..`max_batches` batches with uniformly drawn labels; a draw equal to a window of
    `exclude` (the calibration set, when drawing held-out windows) is redrawn, so the two sets are disjoint."""
    return list(drawn_windows(n, seed=seed, max_batches=max_batches, exclude=exclude))


def drawn_windows(n: int, *, seed: int = 0, max_batches: int = 4,
                  exclude: Collection[StatusWindow] = ()) -> DrawnSequence[StatusWindow]:
    """`make_windows`'s windows, each drawn when a run first reaches it (`DrawnSequence`); `exclude` is read when
    the first window is drawn (a `DrawnSequence` of calibration windows is then drawn whole first)."""
    if n < 1 or max_batches < 1:
        raise ValueError(f"need n >= 1 and max_batches >= 1, got {n}, {max_batches}")
    return DrawnSequence(n, lambda: _drawn_windows(n, seed, max_batches, frozenset(exclude)))


def _drawn_windows(n: int, seed: int, max_batches: int, skip: frozenset[StatusWindow]) -> Iterator[StatusWindow]:
    rng = np.random.default_rng(seed)
    drawn = 0
    while drawn < n:
        labels = tuple(str(rng.choice(LABELS)) for _ in range(int(rng.integers(1, max_batches + 1))))
        w = StatusWindow(tuple(batch_text(rng, lab) for lab in labels), labels)
        if w not in skip:
            drawn += 1
            yield w


def answer_tokens(tokenizer: Any) -> dict[int, str]:
    """A: the first token of each answer word (with and without a leading space) -> its label."""
    return first_token_labels(tokenizer, ANSWER_WORDS)


@dataclass(frozen=True)
class StatusPair:
    """One window's two decision points and the full path."""

    truth: str
    gap: float
    token: int
    header_gap: float
    header_token: int
    full_token: int
    label: str | None
    """The exact decision point's label (None: â ∉ A)."""
    header_label: str | None

    def exact_pair(self) -> GatePair:
        """Exact match: served token correct iff its label is the ground truth."""
        return GatePair(self.gap, self.label is not None, self.label == self.truth)

    def relaxed_pair(self) -> GatePair:
        """Relaxed match (Eq. 14): served token correct iff it equals the model's own full-path token."""
        return GatePair(self.header_gap, self.header_label is not None, self.header_token == self.full_token)


def collect_pairs(engine: Any, tokenizer: Any, windows: Sequence[StatusWindow], *,
                  progress: Callable[[], None] | None = None) -> list[StatusPair]:
    """Per window: ingest its batches, pre-position both decision points, run the full path once."""
    A = answer_tokens(tokenizer)
    pp = Prepositioner(engine, PrepositionConfig(gate=GateConfig(threshold=float("inf")), background=False),
                       tokenizer=tokenizer)
    pairs = []
    try:
        for w in windows:
            with status_session(pp, tokenizer, allow_relaxed=True) as s:
                for b in w.batches:
                    s.append_data(b, preposition=False)  # bulk ingest; the query's registration pre-positions
                s.register_query("status", QUESTION)
                exact = s.state.ready_for(s.query_entry(QUESTION))
                header = s.state.ready_for(s.header_ids())
                if exact is None or header is None:
                    raise RuntimeError("a pre-position did not install (budget skip or engine failure)")
                full = s.ask_standing("status")  # τ = inf: the model's own full path (Δ = 0)
                pairs.append(StatusPair(
                    truth=w.truth, gap=exact.logit_gap, token=exact.top_token, header_gap=header.logit_gap,
                    header_token=header.top_token, full_token=full.token_id, label=A.get(exact.top_token),
                    header_label=A.get(header.top_token)))
            if progress is not None:
                progress()
    finally:
        pp.close()
    return pairs
