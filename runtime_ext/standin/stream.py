"""Server-sent events of the stand-in SGLang server: `/generate` with `"stream": true`, as SGLang 0.5.23 streams.

`srt/entrypoints/http_server.py` (`serve_generate_request`) answers a streamed request with
`Content-Type: text/event-stream` and one `data: <json>\\n\\n` line per output batch, then `data: [DONE]\\n\\n`.
With the server's default (`incremental_streaming_output` off, `tokenizer_manager.py`) each chunk is cumulative:
`output_ids` and every per-token list of `meta_info` hold all tokens so far, `finish_reason` is null until the
last chunk, and `text` is the text so far (L2006-2014 fill in the text an intermediate chunk defers).  A chunk
is sent at each of the scheduler's sends (`stopping.StopRules.send_points`: every token, except while the output
ends with the start of a stop string) with the detokenizer's text at that send (`detokenizer`), `stream_step_s`
apart; the stream stops early - with a last chunk whose finish_reason is {"type": "abort"} - when
`/abort_request` names the request while it is in flight (`LiveStreams`) or the client disconnects.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import threading
import time
from typing import Any, Iterator, Sequence


ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
"""The finish_reason of a running request /abort_request names: the scheduler's `req.to_finish = FINISH_ABORT()`
(no message from that route), FINISH_ABORT.to_json (schedule_batch.py)."""


class LiveStreams:
    """The streamed /generate requests in flight, and SGLang's /abort_request over them: `tokenizer_manager.
    abort_request` ignores an empty rid and a rid no request in flight has (one tokenizer worker), so an abort never
    reaches a later request; the scheduler then aborts every request in flight whose rid starts with it
    (`Scheduler.abort_request`: req.rid.startswith(recv_req.rid)); abort_all aborts all of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, tuple[str, threading.Event]] = {}
        self._count = itertools.count()

    def open(self, rid: str) -> tuple[int, threading.Event]:
        """Register a request in flight; its event is set when it is aborted."""
        key, event = next(self._count), threading.Event()
        with self._lock:
            self._live[key] = (rid, event)
        return key, event

    def close(self, key: int) -> None:
        with self._lock:
            self._live.pop(key, None)

    def abort(self, rid: str, abort_all: bool = False) -> None:
        with self._lock:
            live = list(self._live.values())
        if not abort_all and not any(r == rid for r, _ in live if rid):
            return
        for r, event in live:
            if abort_all or r.startswith(rid):
                event.set()


def sglang_json(payload: Any) -> bytes:
    """`payload` as SGLang's server writes it (orjson): strict JSON, NaN and ±inf as null (a top-k entry of a token
    a grammar masks is -inf in the server and null on the wire)."""
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    return json.dumps(clean(payload), allow_nan=False).encode()


def stream_chunks(out: dict[str, Any], sends: Sequence[tuple[int, str]]) -> Iterator[dict[str, Any]]:
    """The cumulative chunks of a finished response `out`, one per send (output tokens so far, text so far);
    the last one is `out`."""
    n = len(out["output_ids"])
    for t, text in sends[:-1]:
        meta = {k: _head(k, v, t, n) for k, v in out["meta_info"].items()}
        meta.update(finish_reason=None, completion_tokens=t)
        yield {"text": text, "output_ids": out["output_ids"][:t], "meta_info": meta}
    yield out


def batch_stream_chunks(items: Sequence[tuple[dict[str, Any], Sequence[tuple[int, str]]]]) -> list[dict[str, Any]]:
    """A streamed batch (n > 1 too) as SGLang 0.5.23 sends it (`tokenizer_manager._stream_batch_responses`): each
    item's cumulative chunks with its "index" (its place among the batch's outputs), interleaved as the items decode
    side by side (one chunk of each unfinished item in turn; SGLang sends whichever is ready first)."""
    per_item = [[dict(c, index=i) for c in stream_chunks(out, sends)] for i, (out, sends) in enumerate(items)]
    return [c for turn in itertools.zip_longest(*per_item) for c in turn if c is not None]


def _head(key: str, value: Any, t: int, n: int) -> Any:
    """The first t tokens' part of a per-token meta_info value (lists over the n output tokens)."""
    if not key.startswith("output_") or not isinstance(value, list):
        return copy.deepcopy(value)
    if len(value) == n:
        return copy.deepcopy(value[:t])
    if value and all(isinstance(row, list) and len(row) == n for row in value):  # one row per temperature
        return [row[:t] for row in value]
    return copy.deepcopy(value)


def _start_event_stream(handler: Any) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.close_connection = True


def write_failed_stream(handler: Any, last: dict[str, Any] | None) -> None:
    """A stream that fails before its first token: `last` (an error event or an aborted output) then [DONE]; None:
    the headers only, then the connection closes (an exception SGLang's stream generator does not catch)."""
    _start_event_stream(handler)
    try:
        if last is not None:
            handler.wfile.write(b"data: " + sglang_json(last) + b"\n\ndata: [DONE]\n\n")
        handler.wfile.flush()
    except (BrokenPipeError, ConnectionResetError):
        pass


def write_event_stream(handler: Any, chunks: Sequence[dict[str, Any]], rid: str, aborted: Any, step_s: float) -> None:
    """Send `chunks` (`stream_chunks`, `batch_stream_chunks`) as SGLang's event stream on `handler` (a
    BaseHTTPRequestHandler); `aborted(rid)` stops it: each item not finished yet then sends its next chunk, finished
    with the abort."""
    _start_event_stream(handler)
    try:
        for k, chunk in enumerate(chunks):
            if aborted(rid):
                done = {c.get("index") for c in chunks[:k] if c["meta_info"].get("finish_reason") is not None}
                for c in chunks[k:]:
                    if c.get("index") not in done:
                        done.add(c.get("index"))
                        c = dict(c, meta_info=dict(c["meta_info"], finish_reason=ABORTED))
                        handler.wfile.write(b"data: " + sglang_json(c) + b"\n\n")
                break
            handler.wfile.write(b"data: " + sglang_json(chunk) + b"\n\n")
            handler.wfile.flush()
            if step_s > 0 and k < len(chunks) - 1:
                time.sleep(step_s)
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()
    except (BrokenPipeError, ConnectionResetError):  # the client went away: SGLang aborts the request
        pass
