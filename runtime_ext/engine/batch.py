"""The running decode batch of the embedded engine: rows sharing one left-padded KV buffer.

    notion                                   code
    KV buffer [layers, 2, slots, H, cap, D]  RunningBatch.buf (slots = row capacity, cap = columns)
    held columns (common right edge)         RunningBatch.end: row i's buffer KV is columns [end - own, end)
    left padding of row i                    columns [0, end - own): zeros, masked out
    true position of row i's next token      Request.kv_len (position_ids), not the column
    prefix read in place (share_prefix)      Request.prefix: the radix tree's KV segments of the row's first
                                             Request.prefix_len tokens; own = kv_len - prefix_len

With `share_prefix` (the native forward reads KV segments in place) a row joins without copying its cached
prefix: the buffer holds only what the row computes itself, and rows forked from one root read the root's
KV from the same memory.  Without it (transformers' forward needs all keys in the buffer) the prefix is
copied into the row (prefix_len = 0).

A buffer's memory is recycled (`SpareKV`): the buffer a rebuild or the last leaving row releases is kept for the
next one that fits in it.  A fresh buffer of tens of MB costs a page fault per 4 KiB page on first touch (on a
2-core VM, 2026-12-03: 50 ms for a 6-row buffer, 110 ms for 20 rows, 7 % of a 64-token batch's time); a recycled
one none.  With share_prefix nothing is zeroed: the native forward reads only each row's own columns.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .forward import TOKEN_AXIS, copy_segments, kv_buffer_shape
from .radix_cache import RadixCache, path_kv
from .requests import Request


class SpareKV:
    """At most one released KV buffer's memory (flat), handed to the next buffer that fits in it."""

    def __init__(self) -> None:
        self.flat: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self.flat is None else int(self.flat.nbytes)

    def give(self, flat: torch.Tensor | None) -> None:
        """Keep `flat` if it is larger than the memory kept now."""
        if flat is not None and flat.numel() > (0 if self.flat is None else self.flat.numel()):
            self.flat = flat

    def take(self, template: torch.Tensor, rows: int, cap: int, *, zero: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(buffer [layers, 2, rows, kv_heads, cap, head_dim] shaped like template [layers, 2, H, 0, D], its flat
        memory): the kept memory when it is large enough and of the dtype, else new memory; zeroed if `zero`.
        Nothing is kept after a take, so the engine holds at most one buffer's memory beyond its batches'."""
        shape = kv_buffer_shape(template, rows, cap)
        numel = math.prod(shape)
        flat, self.flat = self.flat, None
        if flat is None or flat.numel() < numel or flat.dtype != template.dtype:
            del flat  # kept memory that does not fit is freed before the new memory is allocated
            flat = torch.empty(numel, dtype=template.dtype)
        buf = flat[:numel].view(shape)
        if zero:
            buf.zero_()
        return buf, flat

    def drop(self) -> None:
        self.flat = None


class RunningBatch:
    """Running decode rows sharing one left-padded KV buffer [layers, 2, row_capacity, H, cap, D].

    Row i of `rows` lives in buffer slot i and holds its KV in columns [end - kv_len, end); a step appends
    column `end` for every row.  Rows join in place when a free slot and enough columns are there (else
    the buffer is rebuilt with room to grow), and leave by moving the last row into their slot, so a
    join or a finish copies one row, not the whole batch.
    """

    def __init__(self, template: torch.Tensor, max_rows: int, *, share_prefix: bool = False,
                 spare: SpareKV | None = None) -> None:
        self.template = template
        self.max_rows = max_rows
        self.share_prefix = share_prefix
        self.spare = spare if spare is not None else SpareKV()
        self.rows: list[Request] = []
        self.buf: torch.Tensor | None = None
        self._flat: torch.Tensor | None = None  # buf's memory
        self.end = 0
        self.rebuilds = 0
        self._splits_seen = -1
        self._untracked = True
        """A row joined since the last track_tree (its prefix is re-read once, whatever the splits)."""

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
            self._drop_buffer()
            self.rows = []
            return
        end = max(max(own(r) for r in keep) if keep else 0,
                  max((own_after_join(r, segs, self.share_prefix) for r, segs in add), default=0))
        cap = end + max(r.remaining for r in rows) + 1
        row_cap = min(max(len(rows), self.max_rows), len(rows) + max(4, len(rows) // 2))
        buf, flat = self.spare.take(self.template, row_cap, cap, zero=not self.share_prefix)
        if keep:
            assert self.buf is not None
            index = {id(r): i for i, r in enumerate(self.rows)}
            for i, r in enumerate(keep):
                j, n = index[id(r)], own(r)
                if n:
                    buf[:, :, i, :, end - n : end] = self.buf[:, :, j, :, self.end - n : self.end]
        self.spare.give(self._flat)
        self.rows, self.buf, self._flat, self.end = list(keep), buf, flat, end
        for r, segs in add:
            self._write_row(len(self.rows), r, segs)
            self.rows.append(r)

    def _write_row(self, slot: int, r: Request, segs: Sequence[torch.Tensor]) -> None:
        assert self.buf is not None
        if self.share_prefix:  # read in place: nothing to copy, the row's own columns start empty
            r.prefix, r.prefix_len = list(segs), sum(int(t.shape[TOKEN_AXIS]) for t in segs)
            if r.prefix_len != r.kv_len:
                raise RuntimeError("embedded engine: KV segments do not cover the row's prefix")
            return
        pos = self.end - r.kv_len
        self.buf[:, :, slot, :, :pos] = 0  # pads: finite, masked out
        if copy_segments(self.buf, slot, pos, segs) != self.end:
            raise RuntimeError("embedded engine: KV segments do not cover the row's prefix")

    def join(self, add: Sequence[tuple[Request, Sequence[torch.Tensor]]]) -> None:
        """Add rows between steps (in place when they fit)."""
        if not add:
            return
        self._untracked = True  # a node on a joining row's path may have split after its prefill
        fits = (
            self.buf is not None
            and len(self.rows) + len(add) <= self.buf.shape[2]
            and all(own_after_join(r, segs, self.share_prefix) <= self.end for r, segs in add)
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
            self._drop_buffer()
            return
        longest = max(own(r) for r in self.rows)
        if self.end - longest > max(64, self.end // 2):
            self.rebuild(self.rows, [])

    def _drop_buffer(self) -> None:
        self.spare.give(self._flat)
        self.buf, self._flat, self.end = None, None, 0

    def ensure_step_room(self) -> None:
        assert self.buf is not None
        if self.end + 1 > self.buf.shape[4]:
            self.rebuild(self.rows, [])

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[int]]:
        """One decode step's (input_ids [B, 1], true positions [B, 1], attention mask [B, end + 1] with zeros
        over each row's pads (None with share_prefix: the native forward reads exactly each row's keys), first
        valid buffer column per row)."""
        rows, P = self.rows, self.end
        x = torch.tensor([[r.next_token] for r in rows], dtype=torch.long)
        positions = torch.tensor([[r.kv_len] for r in rows], dtype=torch.long)
        mask = None
        if not self.share_prefix:
            mask = torch.zeros((len(rows), P + 1), dtype=torch.long)
            for i, r in enumerate(rows):
                mask[i, P - r.kv_len :] = 1
        return x, positions, mask, [P - own(r) for r in rows]

    def prefixes(self) -> list[list[torch.Tensor]] | None:
        """Each row's prefix segments (share_prefix), else None; first brought up to date (`track_tree`)."""
        if not self.share_prefix:
            return None
        self.track_tree()
        return [r.prefix for r in self.rows]

    def track_tree(self) -> None:
        """Point each row's prefix at the tensors the radix tree holds now (`tree_prefix`; share_prefix only): a
        node a row reads that a prefill or an insertion split since holds its KV in two new tensors, and the old
        one, kept alive by the row alone, is let go."""
        if self.share_prefix and (self._splits_seen != RadixCache.splits or self._untracked):
            for r in self.rows:
                r.prefix = tree_prefix(r)
            self._splits_seen, self._untracked = RadixCache.splits, False

    def advance(self) -> None:
        """After a step's forward: every row holds one more column of KV."""
        self.end += 1
        for r in self.rows:
            r.kv_len += 1

    def row_kv(self, r: Request) -> torch.Tensor:
        """The KV the row holds in the buffer: tokens [prefix_len, kv_len) [layers, 2, H, own, D] (a view)."""
        assert self.buf is not None
        i = self.rows.index(r)
        return self.buf[:, :, i, :, self.end - own(r) : self.end]


def batch_pair(template: torch.Tensor, max_rows: int, *, share_prefix: bool) -> tuple[RunningBatch, RunningBatch]:
    """The engine's two batches (normal and background), recycling buffer memory through one SpareKV."""
    spare = SpareKV()
    return tuple(RunningBatch(template, max_rows, share_prefix=share_prefix, spare=spare) for _ in range(2))


def own(r: Request) -> int:
    """Tokens of row r's KV held in the batch buffer (the rest is its prefix, read in place)."""
    return r.kv_len - r.prefix_len


def tree_prefix(r: Request) -> list[torch.Tensor]:
    """Row r's prefix segments as the radix tree holds them now: the KV of the path down to the node r locks, then
    the part of its prompt the tree could not take (r's own last segment).  A split node's KV is two new tensors
    (`RadixCache._split`); reading the old one kept it alive beside them, the prompt held twice."""
    if r.node is None:
        return r.prefix
    path = path_kv(r.node)
    rest = r.prefix_len - r.node.depth
    if rest == 0:
        return path
    if rest > 0 and r.prefix and int(r.prefix[-1].shape[TOKEN_AXIS]) == rest:
        return path + [r.prefix[-1]]
    return r.prefix


def private_kv(r: Request, share_prefix: bool) -> int:
    """KV tokens running row r holds outside the radix tree: all its KV when its prefix was copied into the row,
    else all but the prefix the tree holds for it (the path to the node it locks, read in place)."""
    return r.kv_len - (r.node.depth if share_prefix and r.node is not None else 0)


def own_after_join(r: Request, segs: Sequence[torch.Tensor], share_prefix: bool) -> int:
    """Buffer columns a joining row needs: none when its prefix is read in place, else all its KV."""
    return 0 if share_prefix else r.kv_len
