"""The rows and windows of a streaming PreSTO block (`streaming_presto`): one started request as it decodes, and
one window of the MH phase (the streaming counterpart of a model call)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .suffixes import Suffix, SuffixRequest


@dataclass(eq=False)
class Row:
    """One started request: its tokens so far, its suffix once complete."""

    rid: str
    request: SuffixRequest
    window: int
    transition: int
    """j: the transition whose proposal this request is (its seed is transition j's)."""
    ids: tuple[int, ...] = ()
    logq: tuple[float, ...] = ()
    logp0: tuple[float, ...] = ()
    """log q_τ and log p0 of `ids` while the row runs, when the engine reports them (else empty)."""
    suffix: Suffix | None = None
    aborted: bool = False
    used: bool = False
    paths: set[tuple[bool, ...]] = field(default_factory=set)
    """The decision paths from the realized state to the nodes that asked for this row (True: accept): the row
    is reachable while one of them agrees with the decisions the walk makes."""
    resumed: Suffix | None = None
    """What an aborted earlier row of this request decoded: this row decodes the rest (`ids` and `suffix` are
    of the whole request)."""
    previous: "Row | None" = None
    """That aborted row (used when this one is)."""

    @property
    def running(self) -> bool:
        return self.suffix is None and not self.aborted

    @property
    def first(self) -> int:
        """The request's first token this row decodes (after what the aborted row it resumes decoded)."""
        return 0 if self.resumed is None else len(self.resumed.ids)

    @property
    def decoded(self) -> int:
        """Tokens this row decoded itself."""
        return (len(self.suffix.ids) if self.suffix is not None else len(self.ids)) - self.first


@dataclass
class Window:
    """One window of the MH phase (see module docstring)."""

    start: float
    end: float = 0.0
    decisions: list[tuple[int, int, float, bool, Any, int | None]] = field(default_factory=list)
    """(transition j, cut, log A, accepted, state, None) of each realized decision; an early rejection has the
    bound of log A and the proposal tokens it read (`_BlockRun.reject_early`)."""
    rows_started: int = 0
    rows_aborted: int = 0
    steps: int = 0
    row_steps: int = 0
    max_rows: int = 0
