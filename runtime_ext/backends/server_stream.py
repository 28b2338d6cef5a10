"""Streamed requests on an SGLang server (runtime extension `protocol.StreamingEngine`, issue 12).

`submit_stream` sends one `POST /generate` with `"stream": true` (and `input_ids`, as every forerun request)
on a thread of its own and reads SGLang 0.5.23's server-sent events (`srt/entrypoints/http_server.py`,
`serve_generate_request`): one `data: {...}\\n\\n` chunk per detokenizer batch with the request's `output_ids`
and `meta_info` so far (cumulative: the server's default, `incremental_streaming_output` off), then
`data: [DONE]`; a request the server refuses is still HTTP 200, with one `data: {"error": {...}}` event
(`stream_error`: the HTTP error a plain request gets), and one the scheduler aborts ends with a chunk whose
finish_reason is the abort (`check_generate_response` raises it, with its status code).  Each chunk becomes a `RowEvent` (tokens so
far); the last chunk is the complete response, finished like a `generate` call - the exact two-pass recipe
scores prompt + output for log p0 unless the plugin served it (`SGLangServerClient._to_output`).

`abort(rid)` posts SGLang's `/abort_request {"rid": rid}` and closes the stream (a disconnect aborts the
request on the server as well).  `share_from` is accepted and not needed: the server continuously batches
the rows, and a child's prompt is its parent's prompt + the tokens streamed so far, so the radix cache holds
the parent's prompt and the child re-prefills only the c′ − c tokens the parent generated after its own cut
(SGLang inserts a running request's decoded KV into the tree only when it finishes).
"""

from __future__ import annotations

import json
import threading
from typing import Any, Sequence

import requests

from ..protocol import GenerateOutput, RowEvent, RowListener, SamplingParams
from .server_wire import SGLangServerError, WireRequest, check_generate_response, error_text, generate_body


def sse_payloads(lines: Any) -> Any:
    """The JSON payloads of an SGLang event stream (`data: ...` lines), stopping at `data: [DONE]`."""
    for raw in lines:
        line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)


def stream_error(url: str, item: WireRequest, error: Any) -> SGLangServerError:
    """The error event of a stream SGLang refused (`{"error": {"message", "type", "code", "retryable"}}`, HTTP 200),
    raised as the HTTP error a plain request gets: its message and status code."""
    message = error.get("message", error) if isinstance(error, dict) else error
    code = error.get("code") if isinstance(error, dict) else None
    return SGLangServerError(f"SGLang server {url} rejected stream rid={item.rid}: HTTP {code or 'status unknown'} in "
                             f"the stream: {message}", url=url, rids=[item.rid], prompt_lens=[len(item.ids)],
                             status=code if isinstance(code, int) else None)


class ServerStreamingMixin:
    """`submit_stream` / `abort` of `protocol.StreamingEngine` for `SGLangServerClient` (module docstring)."""

    steps_in_lockstep = False
    """Events come from the network as they arrive: the consumer never holds the server between steps."""

    def submit_stream(self: Any, input_ids: Sequence[int], params: SamplingParams, *, rid: str,
                      listener: RowListener, share_from: str | None = None) -> None:
        item = self._wire_request(input_ids, params, rid, None, 0)
        stop = self._abort_events()[rid] = threading.Event()
        threading.Thread(target=self._read_stream, args=(item, listener, stop), name=f"sglang-stream-{rid}",
                         daemon=True).start()

    def _abort_events(self: Any) -> dict[str, threading.Event]:
        """rid -> the abort event of its running stream; made once (dict.setdefault is atomic: two threads
        starting the first streams at once used to make two dicts, and one stream's thread then failed)."""
        return self.__dict__.setdefault("_stream_aborts", {})

    def abort(self: Any, rid: str) -> None:
        stop = self._abort_events().get(rid)
        if stop is not None:
            stop.set()
        try:
            self._http.post(self.base_url + "/abort_request", json={"rid": rid}, headers=self.routing_headers(),
                            timeout=(self.config.connect_timeout_s, self.config.connect_timeout_s))
        except requests.exceptions.RequestException:
            pass  # closing the stream aborts it too

    def _read_stream(self: Any, item: WireRequest, listener: RowListener, stop: threading.Event) -> None:
        url = self.base_url + "/generate"
        body = generate_body([item], False)
        body["stream"] = True
        ids: tuple[int, ...] = ()
        last: dict[str, Any] | None = None
        try:
            with self._http.post(url, json=body, stream=True, headers=self.routing_headers(),
                                 timeout=(self.config.connect_timeout_s, self.config.timeout_s)) as resp:
                if resp.status_code >= 400:
                    raise SGLangServerError(f"SGLang server {url} rejected stream rid={item.rid}: HTTP "
                                            f"{resp.status_code}: {error_text(resp)}", url=url, rids=[item.rid],
                                            status=resp.status_code)
                for chunk in sse_payloads(resp.iter_lines()):
                    if stop.is_set():
                        break
                    if "error" in chunk:  # a refusal (a ValueError of the server's tokenizer manager)
                        raise stream_error(url, item, chunk["error"])
                    last = chunk
                    ids = tuple(int(t) for t in chunk.get("output_ids") or ())
                    if not (chunk.get("meta_info") or {}).get("finish_reason"):
                        listener([RowEvent(item.rid, ids)])
            if stop.is_set():
                listener([RowEvent(item.rid, ids, finished=True, output=_aborted(item, ids))])
                return
            if last is None or not (last.get("meta_info") or {}).get("finish_reason"):
                # SGLang's last chunk always carries the finish_reason: the stream was cut (server gone)
                raise SGLangServerError(f"SGLang server {url} ended stream rid={item.rid} before it finished "
                                        f"({len(ids)} tokens received, no finish_reason)", url=url,
                                        rids=[item.rid], prompt_lens=[len(item.ids)])
            check_generate_response(url, last, [last], [item.rid], [len(item.ids)])
            out = self._to_output(item, last, self._score_stream(item, last))
            listener([RowEvent(item.rid, out.output_ids, finished=True, output=out)])
        except Exception as exc:  # reported to the consumer, never raised on this thread
            listener([RowEvent(item.rid, ids, finished=True, error=exc)])
        finally:  # this stream's entry only: the rid may already name a newer stream (resubmitted on finishing)
            events = self._abort_events()
            if events.get(item.rid) is stop:
                del events[item.rid]

    def _score_stream(self: Any, item: WireRequest, out: dict[str, Any]) -> dict[str, Any] | None:
        """Pass 2 of the exact recipe for a finished stream (as `_generate_many` does for a plain request)."""
        if not self._needs_logp0_pass(item, out):
            return None
        return self._send([self._logp0_request(item, item.ids, out)], batched=False)[0]


def _aborted(item: WireRequest, ids: tuple[int, ...]) -> GenerateOutput:
    return GenerateOutput(input_ids=tuple(item.ids), output_ids=ids, text="",
                          meta_info={"id": item.rid, "finish_reason": {"type": "abort", "message": "aborted"}})
