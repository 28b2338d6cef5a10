"""`ProposalStreams` over any engine-free `ProposalModel`, decoded in lockstep (a test double).

Each row's suffix is the model's answer to its request, computed when the row starts; every `updates()`
call is one decode step that reveals one more token of every running row, like the embedded engine's
continuous batching: a row started between two steps decodes from the next one.  The double checks what
the engine would rely on - a `share_from` row is running and its tokens so far extend the prefix the
child claims - and counts steps, rows and the most rows running at once.  An aborted row is reported at the next
`updates()` with the tokens it decoded and their quantities (`RowUpdate.partial`), as the embedded engine
reports an abort (`report_partial=False`: as a server does, without them); a running row's update carries the
log q_τ and log p0 of its tokens so far, as the embedded engine's does (`report_progress=False`: tokens only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..programs.suffixes import ProposalModel, Suffix, SuffixRequest
from ..programs.stream_proposals import RowUpdate, StreamBatch


@dataclass
class _Running:
    request: SuffixRequest
    suffix: Suffix
    shown: int = 0


@dataclass
class SteppedStreams:
    model: ProposalModel
    rows: dict[str, _Running] = field(default_factory=dict)
    steps: int = 0
    started: list[SuffixRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    shares: list[tuple[str, str, bool]] = field(default_factory=list)
    """(child rid, parent rid, whether the parent's prompt + tokens so far begin with the child's prefix)."""
    max_rows: int = 0
    lockstep: bool = True
    """Each `updates()` is one decode step (the sampler caps a window at T of them)."""
    report_partial: bool = True
    report_progress: bool = True
    """Report a running row's log q_τ and log p0 so far (`RowUpdate.logq/.logp0`) as the embedded engine does
    (False: as a server stream, tokens only)."""
    resumed: list[SuffixRequest] = field(default_factory=list)
    """Requests started whose prefix extends an aborted row's prefix by the tokens it decoded."""
    late_every: int = 0
    """Every late_every-th row started decodes from one step later than the others (0: none), as on the
    embedded engine a row submitted while the engine runs joins at its next pass."""
    _late: set[str] = field(default_factory=set)
    _gone: list[RowUpdate] = field(default_factory=list)
    _aborted_rows: list[_Running] = field(default_factory=list)

    def start(self, rid: str, request: SuffixRequest, share_from: str | None = None) -> None:
        if rid in self.rows:
            raise RuntimeError(f"row {rid} is already running")
        if share_from is not None:
            parent = self.rows.get(share_from)
            ok = parent is not None and self._fed(parent)[: len(request.prefix_ids)] == request.prefix_ids
            self.shares.append((rid, share_from, ok))
        (suffix,) = self.model.generate([request])
        self.rows[rid] = _Running(request, suffix)
        self.started.append(request)
        if self.late_every and len(self.started) % self.late_every == 0:
            self._late.add(rid)
        if any(_continues(request, a) for a in self._aborted_rows):
            self.resumed.append(request)

    @staticmethod
    def _fed(row: _Running) -> tuple[int, ...]:
        return row.request.prefix_ids + tuple(int(t) for t in row.suffix.ids[: row.shown])

    def abort(self, rid: str) -> None:
        row = self.rows.pop(rid, None)
        if row is not None:
            self.aborted.append(rid)
            self._aborted_rows.append(row)
            ids = tuple(int(t) for t in row.suffix.ids[: row.shown])
            partial = row.suffix.head(row.shown) if self.report_partial and row.shown else None
            self._gone.append(RowUpdate(rid, ids, aborted=True, partial=partial))

    def updates(self) -> StreamBatch:
        if not self.rows:
            raise RuntimeError("updates() with no row running: the sampler would wait forever")
        self.steps += 1
        self.max_rows = max(self.max_rows, len(self.rows))
        out = StreamBatch(steps=1, updates=list(self._gone))
        self._gone.clear()
        late, self._late = self._late, set()
        for rid, row in list(self.rows.items()):
            if rid in late:
                continue
            row.shown += 1
            ids = tuple(int(t) for t in row.suffix.ids[: row.shown])
            if row.shown >= len(row.suffix.ids):
                del self.rows[rid]
                out.updates.append(RowUpdate(rid, ids, suffix=row.suffix))
            elif self.report_progress:
                head = row.suffix.head(row.shown)
                out.updates.append(RowUpdate(rid, ids, logq=tuple(map(float, head.logq)),
                                             logp0=tuple(map(float, head.logp0))))
            else:
                out.updates.append(RowUpdate(rid, ids))
        return out

    def pause(self) -> None:
        pass


def _continues(request: SuffixRequest, aborted: _Running) -> bool:
    """Whether `request` resumes the aborted row: its prefix is the row's prefix and 1+ of its decoded tokens, with
    the row's seed and τ, for the rest of its length."""
    head = aborted.request.prefix_ids
    n = len(request.prefix_ids) - len(head)
    return (0 < n <= aborted.shown and request.prefix_ids[: len(head)] == head
            and request.prefix_ids[len(head):] == tuple(int(t) for t in aborted.suffix.ids[:n])
            and request.seed == aborted.request.seed and request.temperature == aborted.request.temperature
            and request.max_tokens == aborted.request.max_tokens - n)
