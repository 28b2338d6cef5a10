"""The HTTP side of `StandInServer`: routes, SGLang's status codes and error bodies, failure injection."""

from __future__ import annotations

import json
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..backends.sglang_frontend import generate_contract_error
from .sessions import SchedulerCrash
from .stream import sglang_json, write_event_stream, write_failed_stream


class HTTPError(Exception):
    """A request SGLang refuses with HTTP `status` and `{"error": {"message": ...}}`.  Streamed (`"stream": true`),
    a 400 (a ValueError of the tokenizer manager) is an HTTP 200 event stream of one error event, then [DONE]; any
    other status is an exception the stream's generator does not catch: 200, then the connection closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SchedulerAbort(HTTPError):
    """A request the scheduler finishes with an abort (`Req.set_finish_with_abort`, `FINISH_ABORT`): a plain /generate
    answers HTTP `status`; a streamed one ends with a chunk whose finish_reason is the abort, then [DONE]
    (`tokenizer_manager._handle_abort_finish_reason` returns it to a stream instead of raising)."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError") -> None:
        super().__init__(status, message)
        self.err_type = err_type
        self.output: dict[str, Any] | None = None
        """The aborted output a stream ends with, when the server made it (an abort before the prefill)."""


class Handler(BaseHTTPRequestHandler):
    """Answers like SGLang 0.5.23's http_server.py for the routes forerun uses (`standin` is set by `make_handler`)."""

    protocol_version = "HTTP/1.1"
    standin: Any
    """The `StandInServer` whose routes this handler answers (duck-typed: this module sits below it)."""

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else (
            payload.encode() if isinstance(payload, str) and content_type != "application/json"
            else sglang_json(payload))
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:
            raise HTTPError(400, f"invalid JSON body: {e}") from e

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        server = self.standin
        parts = urlsplit(self.path)
        path, query = parts.path, parse_qs(parts.query)
        try:
            body = self._body() if method == "POST" else None
            with server.lock:
                server.requests.append((path, body))
                server.request_headers.append((path, dict(self.headers.items())))
                down = server.crashed is not None
            if down:  # the real server died with its scheduler: nothing answers any more
                self._hang_up()
                return
            if path == "/generate":
                key = self.headers.get("X-SMG-Routing-Key") or ""
                with server.lock:
                    server.routing_counts[key] = server.routing_counts.get(key, 0) + 1
                self._generate(body)
            elif path == "/forerun_standin/routing":
                with server.lock:
                    counts = dict(server.routing_counts)
                self._send(200, {"url": server.url, "counts": counts})
            elif path == "/abort_request":
                with server.lock:
                    server.aborted_rids.add(str((body or {}).get("rid")))
                server.live_streams.abort(str((body or {}).get("rid") or ""), bool((body or {}).get("abort_all")))
                self._send(200, b"", "text/plain")
            elif path in ("/server_info", "/get_server_info"):
                self._send(200, server.server_info())
            elif path == "/v1/models":  # http_server.available_models: one ModelCard, the served model
                self._send(200, {"object": "list", "data": [
                    {"id": server.model_path, "object": "model", "created": 0, "owned_by": "sglang",
                     "root": server.model_path, "parent": None, "max_model_len": server.context_length}]})
            elif path in ("/health", "/health_generate", "/ready"):
                self._send(200, b"", "text/plain")
            elif path == "/flush_cache":
                self._flush(float((query.get("timeout") or ["0"])[0]))
            elif path == "/open_session":
                self._open_session(body or {})
            elif path == "/close_session":
                self._close_session(body or {})
            elif path == "/metrics":
                self._send(200, server.metrics_text(), "text/plain; version=0.0.4")
            else:
                self._send(404, {"detail": "Not Found"})
        except HTTPError as e:
            self._send(e.status, {"error": {"message": str(e)}})

    def _hang_up(self) -> None:
        """Close the connection without an answer (a server process that is gone)."""
        self.close_connection = True
        self.connection.close()

    def _flush(self, timeout_s: float) -> None:
        """SGLang flushes only when no request runs or waits; `?timeout=` defers the flush until idle
        (flush_wrapper.py), else the answer is 400 with the scheduler's message."""
        server = self.standin
        deadline = time.monotonic() + max(0.0, timeout_s)
        while server.in_flight() > 0:
            if time.monotonic() >= deadline:
                msg = "Timed out waiting for idle state." if timeout_s > 0 else "Flush cache failed.\n"
                self._send(400, msg, "text/plain")
                return
            time.sleep(0.005)
        server.cache.clear()
        with server.lock:
            server.flushes += 1
        self._send(200, "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
                        "waiting requests, the operation will not be performed.)\n", "text/plain")

    def _failed_stream(self, body: dict[str, Any], e: HTTPError) -> None:
        """A streamed /generate that fails, as `serve_generate_request` streams it (see HTTPError, SchedulerAbort).
        The stand-in decodes a request whole before it streams: an abort after some tokens sends no chunk before
        the abort's."""
        if isinstance(e, SchedulerAbort) and e.output is not None:
            write_failed_stream(self, e.output)
        elif isinstance(e, SchedulerAbort):  # an abort during decoding: its tokens so far are not kept here
            ids = body.get("input_ids")
            meta = {"id": body.get("rid") or uuid.uuid4().hex,
                    "finish_reason": {"type": "abort", "message": str(e), "status_code": e.status,
                                      "err_type": e.err_type},
                    "prompt_tokens": len(ids) if isinstance(ids, list) and ids and isinstance(ids[0], int) else 0,
                    "completion_tokens": 0, "cached_tokens": 0}
            write_failed_stream(self, {"text": "", "output_ids": [], "meta_info": meta})
        elif e.status == 400:
            write_failed_stream(self, {"error": {"message": str(e), "type": "invalid_request_error", "code": 400,
                                                 "retryable": False}})
        else:
            write_failed_stream(self, None)

    def _open_session(self, body: dict[str, Any]) -> None:
        if "capacity_of_str_len" not in body:
            raise HTTPError(422, "capacity_of_str_len: field required")
        sid = body.get("session_id") or uuid.uuid4().hex
        if not self.standin.sessions.open(sid, int(body["capacity_of_str_len"])):
            raise HTTPError(400, "Failed to open the session. Check if a session with the same id is still open.")
        self._send(200, sid)

    def _close_session(self, body: dict[str, Any]) -> None:
        """200 whether or not the session exists: SGLang only sends the close to the scheduler, which logs a
        warning for an unknown id (session_controller.close)."""
        self.standin.sessions.close(body.get("session_id"))
        self._send(200, b"", "text/plain")

    def _generate(self, body: Any) -> None:
        server = self.standin
        refused = generate_contract_error(body)  # SGLang's own JSON schema gate (http_server.generate_request)
        if refused is not None:
            self._send(400, {"error": refused})
            return
        mode = server.take_failure()
        if mode in ("500", "429", "400", "503"):
            raise HTTPError(int(mode), f"injected failure {mode}")
        if mode == "disconnect":
            self._hang_up()
            return
        if mode == "hang":
            server.stop_event.wait(timeout=60)
            self.close_connection = True
            return
        streamed = isinstance(body, dict) and bool(body.get("stream"))
        rid = body.get("rid") if streamed and isinstance(body.get("rid"), str) else ""
        key, aborted = server.live_streams.open(rid)  # in flight from here: /abort_request can reach it
        try:
            answer = server.handle_generate(body)
            if answer.chunks is not None:
                write_event_stream(self, answer.chunks, rid, lambda _rid: aborted.is_set(), server.stream_step_s)
                return
        except SchedulerCrash:  # `server.crashed` is set: this and every later connection closes unanswered
            self._hang_up()
            return
        except HTTPError as e:
            if not streamed:
                raise
            self._failed_stream(body, e)
            return
        finally:
            server.live_streams.close(key)
        out = answer.response
        for o in (out if isinstance(out, list) else [out]):
            if mode == "abort":
                o["meta_info"]["finish_reason"] = {"type": "abort", "message": "injected abort",
                                                   "status_code": None, "err_type": None}
            elif mode == "nan" and o["meta_info"].get("output_token_logprobs"):
                o["meta_info"]["output_token_logprobs"][-1][0] = None  # orjson writes NaN as null
        self._send(200, out)


def make_handler(server: Any) -> type[BaseHTTPRequestHandler]:
    return type("StandInHandler", (Handler,), {"standin": server})
