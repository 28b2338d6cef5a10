"""Streaming requests of the embedded engine (runtime extension `protocol.StreamingEngine`, issue 12).

Two small additions to the engine, used by streaming PreSTO (`programs.streaming_presto`) and nothing else:

- per-row progress: a request submitted with `submit_stream(..., listener=fn)` reports after every decode
  step it takes (`RowEvent`: the tokens generated so far; the `GenerateOutput` once finished), and once
  more when it is aborted or fails.  The listener runs on the engine's worker thread, once per step with
  all of its rows of that step, before the next step is admitted: a request it submits joins the very next
  step.
- a child request that starts inside a running row: `share_from=parent_rid`.  Before the child's admission the
  engine puts the parent row's KV of the longest common prefix of the child's prompt and the parent's fed
  tokens into the radix tree, so the child is charged only what it adds, its prefill is a cache hit (its
  `cached_tokens` = prompt − 1) and no token of that prefix is computed again.  The parent reads that KV from
  the tree from then on (native forward): the shared tokens are held once, not in the tree and again in the
  parent's buffer until it finishes.  Exact: the tree's copy is a clone of the parent's bits, and the native
  attention visits a row's keys in the same order with the same arithmetic whatever segments hold them.  The
  ids are compared, never assumed: a child whose prompt is not a prefix of what the parent fed simply shares
  less (exactness never depends on the hint).

    notion                                      code
    tokens a row has generated so far           RowEvent.output_ids
    KV the parent row holds (fed tokens)        (input_ids + output_ids)[:kv_len]
    shared prefix copied into the radix tree    share_running_prefix(...) -> tokens copied
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from ..protocol import EngineError, RowEvent, RowListener, SamplingParams
from .batch import RunningBatch
from .forward import TOKEN_AXIS
from .kv_handoff import hand_row_kv_to_tree, read_from_tree
from .radix_cache import RadixCache
from .requests import Request, RequestMode


def row_event(r: Request) -> RowEvent:
    done = r.done.is_set()
    return RowEvent(rid=r.rid, output_ids=tuple(r.output_ids), finished=done,
                    output=r.result if done and r.error is None else None, error=r.error if done else None,
                    output_logq=tuple(r.logq) if r.params.return_logprob else None,
                    output_logp0=tuple(r.logp0) if r.params.return_logprob else None,
                    output_top_logprobs=tuple(r.top) if r.params.top_logprobs_num > 0 else None)


def notify_rows(rows: Sequence[Request]) -> None:
    """Call each listener once with the events of its rows (in row order)."""
    by_listener: dict[RowListener, list[RowEvent]] = {}  # bound methods of one object compare equal
    for r in rows:
        if r.listener is not None:
            by_listener.setdefault(r.listener, []).append(row_event(r))
    for fn, events in by_listener.items():
        try:
            fn(events)
        except Exception:  # pragma: no cover - a listener bug must not stop the engine
            logging.getLogger(__name__).exception("stream listener failed")


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def share_running_prefix(radix: RadixCache, batch: RunningBatch, parent: Request | None, child: Request) -> int:
    """Put the parent row's KV of the longest common prefix of the child's prompt (the part the child's prefill
    would compute: its first len − 1 tokens) and the parent's fed tokens into the radix tree.  When the batch reads
    prefixes in place the parent reads that KV from the tree from now on (its columns keep only what follows) and
    the tree's tokens are paid from its reservation (`kv_handoff`): held and charged once.  Returns how many of the
    parent's generated tokens the child now shares (0 when the parent is not running in `batch` or shares nothing
    beyond its prompt)."""
    if parent is None or not any(row is parent for row in batch.rows):
        return 0
    fed = (parent.input_ids + tuple(parent.output_ids))[: parent.kv_len]
    m = common_prefix_length(fed, child.input_ids[: len(child.input_ids) - 1])
    shared = m - (len(parent.input_ids) - 1)  # the parent's generated tokens whose KV the child shares
    if shared <= 0 or m <= parent.prefix_len:  # in the tree already: its prompt, or what it shared before
        return max(shared, 0)
    part = batch.row_kv(parent).narrow(TOKEN_AXIS, 0, m - parent.prefix_len)  # tokens [prefix_len, m)
    if not parent.prefix or parent.node.depth == parent.prefix_len:  # no prefix read, or the tree holds all of it
        kv, offset = part, parent.prefix_len
    else:  # part of its prefix is the parent's own (it did not fit in the tree): give the whole KV
        kv, offset = torch.cat([*parent.prefix, part], dim=TOKEN_AXIS), 0
    if batch.share_prefix:
        node, _ = hand_row_kv_to_tree(radix, parent, fed[:m], kv, offset=offset)
        read_from_tree(radix, parent, node)
    else:  # the fallback's parent keeps every key in its buffer: the tree's copy is a second one
        radix.insert(fed[:m], kv, offset=offset)  # clones the slice
    return shared


class StreamingMixin:
    """`submit_stream` of `protocol.StreamingEngine` on the embedded engine (see module docstring)."""

    def submit_stream(self, input_ids: Sequence[int], params: SamplingParams, *, rid: str, listener: RowListener,
                      share_from: str | None = None) -> None:
        """Start a decoding request without waiting; `listener` hears its progress (module docstring).
        `share_from`: the rid of a running row whose fed tokens begin with this prompt (KV shared)."""
        if params.max_new_tokens < 1:
            raise EngineError(f"request {rid}: a streamed request must generate (max_new_tokens >= 1)")
        req = self._make_request(input_ids, params, rid=rid, priority=0, mode=RequestMode.GENERATE)  # type: ignore[attr-defined]
        req.listener, req.share_from = listener, share_from
        self._submit([req])  # type: ignore[attr-defined]

    def _share_from_parents(self: Any) -> None:
        """Before admission: each waiting child whose parent row is running gets the parent's KV of its prompt
        into the tree (`share_running_prefix`), so that its admission charges only the tokens it adds (its
        `share_from` is then cleared: shared once).  Runs under the engine's lock, as admission does."""
        for r in self._waiting:
            parent = None if r.share_from is None else self._by_rid.get(r.share_from)
            if parent is not None and parent in self._normal.rows:
                self._counters["stream_shared_tokens"] += share_running_prefix(self.radix, self._normal, parent, r)
                r.share_from = None
