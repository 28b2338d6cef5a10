"""`ProposalStreams` over any engine-free `ProposalModel`, decoded in lockstep (a test double).

Each row's suffix is the model's answer to its request, computed when the row starts; every `updates()`
call is one decode step that reveals one more token of every running row, like the embedded engine's
continuous batching: a row started between two steps decodes from the next one.  The double checks what
the engine would rely on - a `share_from` row is running and its tokens so far extend the prefix the
child claims - and counts steps, rows and the most rows running at once.
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

    @staticmethod
    def _fed(row: _Running) -> tuple[int, ...]:
        return row.request.prefix_ids + tuple(int(t) for t in row.suffix.ids[: row.shown])

    def abort(self, rid: str) -> None:
        if self.rows.pop(rid, None) is not None:
            self.aborted.append(rid)

    def updates(self) -> StreamBatch:
        if not self.rows:
            raise RuntimeError("updates() with no row running: the sampler would wait forever")
        self.steps += 1
        self.max_rows = max(self.max_rows, len(self.rows))
        out = StreamBatch(steps=1)
        for rid, row in list(self.rows.items()):
            row.shown += 1
            ids = tuple(int(t) for t in row.suffix.ids[: row.shown])
            if row.shown >= len(row.suffix.ids):
                del self.rows[rid]
                out.updates.append(RowUpdate(rid, ids, suffix=row.suffix))
            else:
                out.updates.append(RowUpdate(rid, ids))
        return out

    def pause(self) -> None:
        pass
