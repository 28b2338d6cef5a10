"""A fake SGLang 0.5.23 HTTP server for tests: the same JSON, a tiny deterministic numpy "model".

The real server cannot run on CPU machines, so `SGLangServerBackend` is tested against this stand-in.
It speaks the request/response shapes of `srt/entrypoints/http_server.py` and
`srt/managers/tokenizer_manager.py` for the fields forerun uses, with outputs a test can recompute
exactly from `FakeByteModel` (`fake_model`, where the model's notation table is):

    SGLang                                fake
    output_token_logprobs                 [log q_τ(y_t), y_t, text] (log_softmax(z / τ), before top-k/top-p)
    input_token_logprobs                  SGLang shift: entry 0 is [None, x_s, text] for s =
                                          logprob_start_len (-1 -> len(prompt) - 1), then
                                          [log p0(x_j | x_<j), x_j, text] for j > s
    output_top_logprobs                   top-k of log q_τ per output token (as SGLang: same logprobs)
    input_top_logprobs                    [None] + top-k of log p0 at positions s+1..L-1
    cached_tokens                         longest prefix of the prompt already in the fake's PrefixTrie

Endpoints: POST /generate (single and batched: `input_ids` a list of lists, per-item lists or scalars
for the other fields), GET /server_info and /get_server_info, GET /health, POST /flush_cache,
POST /open_session, POST /close_session, GET /metrics (Prometheus text).

Failure injection (`FakeSGLangServer.fail(mode, times)`): "500", "429", "400" (HTTP errors with
SGLang's `{"error": {"message": ...}}` body), "abort" (200 with `finish_reason.type == "abort"`),
"disconnect" (the connection is closed without a response), "hang" (no answer until the client gives
up or the server stops).  `plugin_keys=True` mimics a sampler plugin that reports
`output_token_logp0` / `output_token_entropy` through `customized_info` (surfaced as meta_info keys).
Every request body is recorded in `server.requests` as (path, parsed JSON).
"""

from __future__ import annotations

import json
import tempfile
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence

import numpy as np

from .fake_model import (
    BOS_ID,
    EOS_ID,
    VOCAB_SIZE,
    FakeByteModel,
    FakeGeneration,
    FakeSampling,
    PrefixTrie,
    fake_generate,
    fake_tokenizer,
)

__all__ = ["BOS_ID", "EOS_ID", "VOCAB_SIZE", "FAIL_MODES", "FakeByteModel", "FakeSGLangServer", "fake_tokenizer",
           "unused_port"]


@dataclass
class _Failure:
    mode: str
    times: int


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


FAIL_MODES = ("500", "429", "400", "503", "abort", "disconnect", "hang")


class FakeSGLangServer:
    """A ThreadingHTTPServer on 127.0.0.1 (random port unless `port` is given) that answers like SGLang 0.5.23.

    Use as a context manager: `with FakeSGLangServer() as srv: backend = SGLangServerBackend(srv.url, ...)`.
    """

    def __init__(self, *, model: FakeByteModel | None = None, plugin_keys: bool = False,
                 model_path: str = "forerun-fake-byte-model", tokenizer_path: str | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.model = model or FakeByteModel()
        self.host = host
        self.port = port
        self.tokenizer = fake_tokenizer()
        self.plugin_keys = plugin_keys
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path
        self._tokenizer_dir: tempfile.TemporaryDirectory | None = None
        self.requests: list[tuple[str, Any]] = []
        self.cache = PrefixTrie()
        self.sessions: dict[str, int] = {}
        self.counters = {"prompt_tokens_total": 0, "cached_tokens_total": 0, "generation_tokens_total": 0,
                         "num_requests_total": 0}
        self._failures: list[_Failure] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seed_rng = np.random.default_rng(12345)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("FakeSGLangServer is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeSGLangServer":
        if self.tokenizer_path is None:
            self._tokenizer_dir = tempfile.TemporaryDirectory(prefix="forerun-fake-tokenizer-")
            self.tokenizer.save_pretrained(self._tokenizer_dir.name)
            self.tokenizer_path = self._tokenizer_dir.name
        handler = _make_handler(self)
        self._httpd = ThreadingHTTPServer((self.host, self.port), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-sglang", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._tokenizer_dir is not None:
            self._tokenizer_dir.cleanup()
            self._tokenizer_dir = None

    def __enter__(self) -> "FakeSGLangServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- test controls ----------------------------------------------------------------------
    def fail(self, mode: str, times: int = 1) -> None:
        """Make the next `times` /generate requests fail with `mode` (one of FAIL_MODES)."""
        if mode not in FAIL_MODES:
            raise ValueError(f"fail mode must be one of {FAIL_MODES}, got {mode!r}")
        if times < 1:
            raise ValueError(f"times must be >= 1, got {times}")
        with self._lock:
            self._failures.append(_Failure(mode, times))

    def _take_failure(self) -> str | None:
        with self._lock:
            while self._failures and self._failures[0].times <= 0:
                self._failures.pop(0)
            if not self._failures:
                return None
            f = self._failures[0]
            f.times -= 1
            return f.mode

    def generate_bodies(self) -> list[dict[str, Any]]:
        """The recorded /generate request bodies, in arrival order."""
        with self._lock:
            return [body for path, body in self.requests if path == "/generate"]

    def server_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "served_model_name": self.model_path,
            "version": "0.5.23-forerun-fake",
            "enable_metrics": True,
            "enable_session_radix_cache": True,
            "internal_states": [{"vocab_size": VOCAB_SIZE}],
            "frontend": "python",
        }

    def metrics_text(self) -> str:
        lines = []
        for key, val in self.counters.items():
            lines.append(f"# TYPE sglang:{key} counter")
            lines.append(f'sglang:{key}{{model_name="{self.model_path}"}} {float(val)}')
        return "\n".join(lines) + "\n"

    # -- /generate --------------------------------------------------------------------------
    def handle_generate(self, body: dict[str, Any]) -> Any:
        if not isinstance(body, dict):
            raise _HTTPError(400, "request body must be a JSON object")
        if body.get("input_ids") is not None:
            ids_field = body["input_ids"]
            batched = bool(ids_field) and isinstance(ids_field[0], list)
            prompts = ids_field if batched else [ids_field]
        elif body.get("text") is not None:
            batched = isinstance(body["text"], list)
            texts = body["text"] if batched else [body["text"]]
            prompts = [self.tokenizer.encode(t) for t in texts]
        else:
            raise _HTTPError(400, "Either text, input_ids or input_embeds should be provided.")
        n = len(prompts)

        def item(key: str, default: Any, i: int) -> Any:
            val = body.get(key, default)
            if val is None:
                return default
            if batched and isinstance(val, list) and key != "stop":
                if len(val) != n:
                    raise _HTTPError(400, f"{key} has {len(val)} entries for a batch of {n}")
                return val[i] if val[i] is not None else default
            return val

        outs = []
        for i, ids in enumerate(prompts):
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                raise _HTTPError(400, "input_ids must be a list of ints (or a list of such lists)")
            if len(ids) == 0:
                raise _HTTPError(400, "The input_ids is empty.")
            if any(t < 0 or t >= VOCAB_SIZE for t in ids):
                raise _HTTPError(400, f"input_ids contain an id outside [0, {VOCAB_SIZE})")
            rid = body.get("rid")
            rid = (rid[i] if isinstance(rid, list) else (f"{rid}-{i}" if batched and rid else rid)) or uuid.uuid4().hex
            session = body.get("session_params")
            if isinstance(session, dict) and session.get("id") is not None and session["id"] not in self.sessions:
                raise _HTTPError(400, f"session id {session['id']} does not exist")
            outs.append(self._generate_one(
                ids,
                item("sampling_params", {}, i) or {},
                rid=rid,
                return_logprob=bool(item("return_logprob", False, i)),
                logprob_start_len=int(item("logprob_start_len", -1, i)),
                top_logprobs_num=int(item("top_logprobs_num", 0, i)),
                return_text=bool(body.get("return_text_in_logprobs", False)),
            ))
        return outs if batched else outs[0]

    def _generate_one(self, ids: list[int], sp: dict[str, Any], *, rid: str, return_logprob: bool,
                      logprob_start_len: int, top_logprobs_num: int, return_text: bool) -> dict[str, Any]:
        sampling = self._sampling(sp)
        tok = self.tokenizer

        def text_of(t: int) -> str | None:
            return tok.decode([t]) if return_text else None

        cached = self.cache.match(ids)
        gen = fake_generate(self.model, ids, sampling, top_logprobs_num, text_of)
        self.cache.insert(list(ids) + gen.ids)
        with self._lock:
            self.counters["prompt_tokens_total"] += len(ids)
            self.counters["cached_tokens_total"] += cached
            self.counters["generation_tokens_total"] += len(gen.ids)
            self.counters["num_requests_total"] += 1
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": gen.finish,
            "prompt_tokens": len(ids),
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(gen.ids),
            "cached_tokens": cached,
            "e2e_latency": 0.0,
        }
        if return_logprob:
            meta.update(self._logprob_meta(ids, gen, logprob_start_len, top_logprobs_num, text_of))
        if self.plugin_keys:
            meta["output_token_logp0"] = gen.logp0
            meta["output_token_entropy"] = gen.entropy
        return {"text": tok.decode(gen.ids), "output_ids": gen.ids, "meta_info": meta}

    def _sampling(self, sp: dict[str, Any]) -> FakeSampling:
        """SGLang's sampling_params with its defaults; a missing sampling_seed draws a fresh one."""
        fields = dict(
            max_new_tokens=int(sp.get("max_new_tokens", 128)),
            temperature=float(sp.get("temperature", 1.0)),
            top_k=int(sp.get("top_k", -1)),
            top_p=float(sp.get("top_p", 1.0)),
            ignore_eos=bool(sp.get("ignore_eos", False)),
            min_new_tokens=int(sp.get("min_new_tokens", 0)),
            stop_token_ids=frozenset(int(t) for t in (sp.get("stop_token_ids") or [])),
        )
        seed = sp.get("sampling_seed")
        if seed is None:
            seed = int(self._seed_rng.integers(0, 2**62))
        if fields["max_new_tokens"] < 0 or fields["temperature"] < 0:
            raise _HTTPError(400, "max_new_tokens and temperature must be >= 0")
        return FakeSampling(seed=seed, **fields)

    def _logprob_meta(self, ids: list[int], gen: FakeGeneration, logprob_start_len: int, top_logprobs_num: int,
                      text_of: Any) -> dict[str, Any]:
        """The logprob keys of meta_info (return_logprob): prompt entries with SGLang's shift, output entries."""
        m = self.model
        start = len(ids) - 1 if logprob_start_len < 0 else min(logprob_start_len, len(ids) - 1)
        in_lp: list[list] = [[None, ids[start], text_of(ids[start])]]
        in_top: list[Any] = [None]
        for j in range(start + 1, len(ids)):
            lp0 = m.logp0(ids[:j])
            in_lp.append([float(lp0[ids[j]]), ids[j], text_of(ids[j])])
            if top_logprobs_num > 0:
                top = np.argsort(-lp0, kind="stable")[:top_logprobs_num]
                in_top.append([[float(lp0[k]), int(k), text_of(int(k))] for k in top])
        meta: dict[str, Any] = {
            "input_token_logprobs": in_lp,
            "output_token_logprobs": [[lq, t, text_of(t)] for lq, t in zip(gen.logq, gen.ids)],
            "output_token_logprobs_length": len(gen.ids),
        }
        if top_logprobs_num > 0:
            meta["input_top_logprobs"] = in_top
            meta["output_top_logprobs"] = gen.top
        return meta


class _Handler(BaseHTTPRequestHandler):
    """The HTTP side of a FakeSGLangServer (`fake`, set on the subclass `_make_handler` builds)."""

    protocol_version = "HTTP/1.1"
    fake: FakeSGLangServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else (
            payload.encode() if isinstance(payload, str) and content_type != "application/json"
            else json.dumps(payload).encode())
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
            raise _HTTPError(400, f"invalid JSON body: {e}") from e

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        server = self.fake
        path = self.path.split("?", 1)[0]
        try:
            body = self._body() if method == "POST" else None
            with server._lock:
                server.requests.append((path, body))
            if path == "/generate":
                self._generate(body)
            elif path in ("/server_info", "/get_server_info"):
                self._send(200, server.server_info())
            elif path in ("/health", "/health_generate", "/ready"):
                self._send(200, b"", "text/plain")
            elif path == "/flush_cache":
                server.cache.clear()
                self._send(200, "Cache flushed.\n", "text/plain")
            elif path == "/open_session":
                self._open_session(body or {})
            elif path == "/close_session":
                self._close_session(body or {})
            elif path == "/metrics":
                self._send(200, server.metrics_text(), "text/plain; version=0.0.4")
            else:
                self._send(404, {"detail": "Not Found"})
        except _HTTPError as e:
            self._send(e.status, {"error": {"message": str(e)}})

    def _open_session(self, body: dict[str, Any]) -> None:
        if "capacity_of_str_len" not in body:
            raise _HTTPError(422, "capacity_of_str_len: field required")
        sid = body.get("session_id") or uuid.uuid4().hex
        if sid in self.fake.sessions:
            raise _HTTPError(400, "Failed to open the session. Check if a session with the same id is still open.")
        self.fake.sessions[sid] = int(body["capacity_of_str_len"])
        self._send(200, sid)

    def _close_session(self, body: dict[str, Any]) -> None:
        sid = body.get("session_id")
        if sid not in self.fake.sessions:
            raise _HTTPError(400, f"session id {sid} does not exist")
        del self.fake.sessions[sid]
        self._send(200, b"", "text/plain")

    def _generate(self, body: Any) -> None:
        server = self.fake
        mode = server._take_failure()
        if mode in ("500", "429", "400", "503"):
            raise _HTTPError(int(mode), f"injected failure {mode}")
        if mode == "disconnect":
            self.close_connection = True
            self.connection.close()
            return
        if mode == "hang":
            server._stop.wait(timeout=60)
            self.close_connection = True
            return
        out = server.handle_generate(body)
        if mode == "abort":
            for o in (out if isinstance(out, list) else [out]):
                o["meta_info"]["finish_reason"] = {"type": "abort", "message": "injected abort",
                                                   "status_code": None, "err_type": None}
        self._send(200, out)


def _make_handler(server: FakeSGLangServer) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"fake": server})


def unused_port() -> int:
    """A local TCP port nothing listens on (for connection-refused tests)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m forerun.testing.fake_sglang_server --port P` (accepts and ignores other sglang flags)."""
    import argparse

    parser = argparse.ArgumentParser(description="fake SGLang server (tests / launcher checks)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--model-path", default="forerun-fake-byte-model")
    parser.add_argument("--plugin-keys", action="store_true")
    args, _unknown = parser.parse_known_args(argv)
    srv = FakeSGLangServer(host=args.host, port=args.port, model_path=args.model_path, plugin_keys=args.plugin_keys)
    srv.start()
    print(f"fake SGLang server on {srv.url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
