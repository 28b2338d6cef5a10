"""Streaming requests of the embedded engine (runtime extension `protocol.StreamingEngine`, issue 12).

Two small additions to the engine, used by streaming PreSTO (`programs.streaming_presto`) and nothing else:

- per-row progress: a request submitted with `submit_stream(..., listener=fn)` reports after every decode
  step it takes (`RowEvent`: the tokens generated so far; the `GenerateOutput` once finished), and once
  more when it is aborted or fails.  The listener runs on the engine's worker thread, once per step with
  all of its rows of that step, before the next step is admitted: a request it submits joins the very next
  step.
- a child request that starts inside a running row: `share_from=parent_rid`.  At the child's admission the
  engine copies the parent row's KV of the longest common prefix of the child's prompt and the parent's fed
  tokens into the radix tree, so the child's prefill is a cache hit (its `cached_tokens` = prompt − 1) and
  no token of that prefix is computed again.  The ids are compared, never assumed: a child whose prompt
  is not a prefix of what the parent fed simply shares less (exactness never depends on the hint).

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
    """Copy the parent row's KV of the longest common prefix of the child's prompt (the part the child's
    prefill would compute: its first len − 1 tokens) and the parent's fed tokens into the radix tree.
    Returns how many of the parent's generated tokens the child now shares (0 when the parent is not running
    in `batch` or shares nothing beyond its prompt)."""
    if parent is None or not any(row is parent for row in batch.rows):
        return 0
    fed = (parent.input_ids + tuple(parent.output_ids))[: parent.kv_len]
    m = common_prefix_length(fed, child.input_ids[: len(child.input_ids) - 1])
    if m <= len(parent.input_ids) - 1:  # the parent's prompt went into the tree at its own prefill
        return 0
    own = batch.row_kv(parent)  # tokens [prefix_len, kv_len)
    part = own.narrow(TOKEN_AXIS, 0, m - parent.prefix_len)
    try:
        radix.insert(fed[:m], part, offset=parent.prefix_len)  # clones the slice
    except ValueError:  # the parent's prefix is not (all) in the tree: give the whole KV
        radix.insert(fed[:m], torch.cat([*parent.prefix, part], dim=TOKEN_AXIS), offset=0)
    return m - (len(parent.input_ids) - 1)  # the parent's generated tokens whose KV the child now shares


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

    def _share_from_parent(self: Any, r: Request) -> None:
        if r.share_from is not None:
            copied = share_running_prefix(self.radix, self._normal, self._by_rid.get(r.share_from), r)
            self._counters["stream_shared_tokens"] += copied
