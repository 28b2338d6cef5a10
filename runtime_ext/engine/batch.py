"""The running decode batch of the embedded engine: rows sharing one left-padded KV buffer.

    notion                                   code
    KV buffer [layers, 2, slots, H, cap, D]  RunningBatch.buf (slots = row capacity, cap = columns)
    held columns (common right edge)         RunningBatch.end: row i's KV is columns [end - kv_len, end)
    left padding of row i                    columns [0, end - kv_len): zeros, masked out
    true position of row i's next token      Request.kv_len (position_ids), not the column
"""

from __future__ import annotations

from typing import Sequence

import torch

from .kernels import copy_segments, empty_kv_buffer
from .requests import Request


class RunningBatch:
    """Running decode rows sharing one left-padded KV buffer [layers, 2, row_capacity, H, cap, D].

    Row i of `rows` lives in buffer slot i and holds its KV in columns [end - kv_len, end); a step appends
    column `end` for every row.  Rows join in place when a free slot and enough columns are there (else
    the buffer is rebuilt with room to grow), and leave by moving the last row into their slot, so a
    join or a finish copies one row, not the whole batch.
    """

    def __init__(self, template: torch.Tensor, max_rows: int) -> None:
        self.template = template
        self.max_rows = max_rows
        self.rows: list[Request] = []
        self.buf: torch.Tensor | None = None
        self.end = 0
        self.rebuilds = 0

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def active(self) -> torch.Tensor:
        """The occupied slots' buffer [layers, 2, B, H, cap, D] (a view)."""
        assert self.buf is not None
        return self.buf[:, :, : len(self.rows)]

    def rebuild(self, keep: Sequence[Request], add: Sequence[tuple[Request, Sequence[torch.Tensor]]]) -> None:
        """New buffer holding `keep` (copied from the old buffer) and `add` (copied from KV segments)."""
        rows = list(keep) + [r for r, _ in add]
        self.rebuilds += 1
        if not rows:
            self.rows, self.buf, self.end = [], None, 0
            return
        end = max(r.kv_len for r in rows)
        cap = end + max(r.remaining for r in rows) + 1
        row_cap = min(max(len(rows), self.max_rows), len(rows) + max(4, len(rows) // 2))
        buf = empty_kv_buffer(self.template, row_cap, cap)
        if keep:
            assert self.buf is not None
            index = {id(r): i for i, r in enumerate(self.rows)}
            for i, r in enumerate(keep):
                j = index[id(r)]
                if r.kv_len:
                    buf[:, :, i, :, end - r.kv_len : end] = self.buf[:, :, j, :, self.end - r.kv_len : self.end]
        self.rows, self.buf, self.end = list(keep), buf, end
        for r, segs in add:
            self._write_row(len(self.rows), r, segs)
            self.rows.append(r)

    def _write_row(self, slot: int, r: Request, segs: Sequence[torch.Tensor]) -> None:
        assert self.buf is not None
        pos = self.end - r.kv_len
        self.buf[:, :, slot, :, :pos] = 0  # pads: finite, masked out
        if copy_segments(self.buf, slot, pos, segs) != self.end:
            raise RuntimeError("embedded engine: KV segments do not cover the row's prefix")

    def join(self, add: Sequence[tuple[Request, Sequence[torch.Tensor]]]) -> None:
        """Add rows between steps (in place when they fit)."""
        if not add:
            return
        fits = (
            self.buf is not None
            and len(self.rows) + len(add) <= self.buf.shape[2]
            and all(r.kv_len <= self.end for r, _ in add)
            and self.end + max(r.remaining for r, _ in add) + 1 <= self.buf.shape[4]
        )
        if not fits:
            self.rebuild(self.rows, add)
            return
        for r, segs in add:
            self._write_row(len(self.rows), r, segs)
            self.rows.append(r)

    def leave(self, gone: Sequence[Request]) -> None:
        """Remove rows (the last row moves into each freed slot); compact when padding dominates."""
        gone_ids = {id(r) for r in gone}
        assert self.buf is not None
        i = 0
        while i < len(self.rows):
            if id(self.rows[i]) in gone_ids:
                last = len(self.rows) - 1
                if i != last:
                    self.buf[:, :, i, :, : self.end] = self.buf[:, :, last, :, : self.end]
                    self.rows[i] = self.rows[last]
                self.rows.pop()
            else:
                i += 1
        if not self.rows:
            self.buf, self.end = None, 0
            return
        longest = max(r.kv_len for r in self.rows)
        if self.end - longest > max(64, self.end // 2):
            self.rebuild(self.rows, [])

    def ensure_step_room(self) -> None:
        assert self.buf is not None
        if self.end + 1 > self.buf.shape[4]:
            self.rebuild(self.rows, [])

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
        """One decode step's (input_ids [B, 1], true positions [B, 1], attention mask [B, end + 1] with zeros
        over each row's pads, first valid column per row)."""
        rows, P = self.rows, self.end
        x = torch.tensor([[r.next_token] for r in rows], dtype=torch.long)
        positions = torch.tensor([[r.kv_len] for r in rows], dtype=torch.long)
        mask = torch.zeros((len(rows), P + 1), dtype=torch.long)
        for i, r in enumerate(rows):
            mask[i, P - r.kv_len :] = 1
        return x, positions, mask, [P - r.kv_len for r in rows]

    def advance(self) -> None:
        """After a step's forward: every row holds one more column of KV."""
        self.end += 1
        for r in self.rows:
            r.kv_len += 1

    def row_kv(self, r: Request) -> torch.Tensor:
        assert self.buf is not None
        i = self.rows.index(r)
        return self.buf[:, :, i, :, self.end - r.kv_len : self.end]
