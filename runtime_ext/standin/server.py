"""The stand-in SGLang 0.5.23 HTTP server: the same JSON, a tiny deterministic numpy "model" (not SGLang).

The real server cannot run on CPU machines, so `SGLangServerBackend` is tested against this stand-in and
`forerun bench scaleout` runs it as its simulated GPU workers (`python -m forerun.runtime_ext.standin.server`).
It speaks the request/response shapes of `srt/entrypoints/http_server.py` and
`srt/managers/tokenizer_manager.py` for the fields forerun uses (the contract test checks them against
SGLang's own models), with outputs a test can recompute exactly from `ByteModel` (`byte_model`):

    SGLang                                stand-in
    output_token_logprobs                 [log q_τ(y_t), y_t, text] (log_softmax(z / τ), before top-k/top-p)
    input_token_logprobs                  SGLang shift: entry 0 is [None, x_s, text] for s = logprob_start_len,
                                          then [log p0(x_j | x_<j), x_j, text] for j > s; none at all for
                                          s = -1 (the default: scheduler.py L3260-3264 moves it to the prompt
                                          length) or s = len(prompt); s > len(prompt) is refused (HTTP 400)
    output_top_logprobs                   top-k of log q_τ per output token (as SGLang: same logprobs)
    input_top_logprobs                    [None] + top-k of log p0 at positions s+1..L-1 ([] when none)
    cached_tokens                         longest prefix of the prompt already in the stand-in's PrefixTrie, at
                                          most all but its last token and at most logprob_start_len when logprobs
                                          start there (`prefix_match_limit`)
    finish_reason, stop, stop_regex,      SGLang's stop rules (`stopping`): stop strings and patterns searched
    stop_token_ids, ignore_eos,           in a tail window of the output, then stop ids / EOS (not under
    max_new_tokens, min_new_tokens        ignore_eos), then the length; {"type": "stop", "matched": string |
                                          pattern | id} or {"type": "length", "length": max_new_tokens};
                                          min_new_tokens masks EOS and stop ids (byte_model), more than
                                          max_new_tokens is HTTP 400; max_new_tokens 0: no tokens, length 0;
                                          capped at context_length - 2 - prompt (the scheduler's max_req_len)
    temperature                           0 <= τ < 1e-6 is greedy (τ = 0), as SamplingParams.__post_init__
    n (parallel sampling)                 n > 1: per prompt a prefill-only warm-up, then n samples with fresh rids,
                                          answered as a list prompt by prompt (tokenizer_manager._handle_batch_
                                          request); streamed, each item's chunks with its "index", interleaved
                                          (`stream`); NOT as SGLang: an item's own rid does not abort it alone
    regex, json_schema, ebnf              xgrammar's mask over the byte vocabulary (`constraints`): every
                                          reported logprob is of the masked logits, as SGLang's
    text, no_stop_trim                    SGLang's detokenizer (`detokenizer`): the output without special
                                          tokens, a matched stop id dropped, cut before the first occurrence of
                                          a matched string (after it with no_stop_trim)

The server's modes, as SGLang's:
    deterministic=True                    --enable-deterministic-inference: sampling_seed is used (42 when none,
                                          sampling_batch_info.py L163; backend "pytorch"); False: fresh noise
                                          whatever the seed (backend "flashinfer")
    /flush_cache                          400 while a /generate runs; `?timeout=S` waits up to S s for idle
    sessions (`sessions`)                 history of session_params.rid prepended, BOS of the new turn stripped;
                                          a session abort (unknown rid, ...): HTTP 400 with SGLang's message
                                          (tokenizer_manager.py L1917-1918); replace=True without rid on a
                                          non-empty session crashes the server: this and every later connection
                                          closes unanswered (`crashed` says why)
    plugin=True                           the forerun sampler plugin (`launch_runtime --plugin`): /server_info
                                          gains "forerun_plugin"; a request whose custom_params has
                                          forerun_plugin: true gets output_token_logp0 / _entropy /
                                          _logq_by_temperature in meta_info

Endpoints: POST /generate (single and batched: `input_ids` a list of lists, per-item lists or scalars
for the other fields), GET /server_info and /get_server_info, GET /health, POST /flush_cache,
POST /open_session, POST /close_session, GET /metrics (Prometheus text), POST /abort_request, GET /v1/models
(max_model_len: `context_length`; a request past it is refused, `stopping.context_error`); a /generate with
`"stream": true` answers with SGLang's server-sent events (`stream`), its failures too (routes.HTTPError).

Failure injection (`StandInServer.fail(mode, times)`): "500", "429", "400" (HTTP errors with
SGLang's `{"error": {"message": ...}}` body), "abort" (200 with `finish_reason.type == "abort"`),
"disconnect" (the connection is closed without a response), "hang" (no answer until the client gives
up or the server stops), "nan" (a NaN logprob, written as null as SGLang's orjson does).
Every request body is recorded in `server.requests` as (path, parsed JSON), its headers in
`server.request_headers` as (path, {name: value}).
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
import uuid
from dataclasses import dataclass, replace
from http.server import ThreadingHTTPServer
from typing import Any, Sequence

import numpy as np

from .byte_model import (
    BOS_ID,
    EOS_ID,
    VOCAB_SIZE,
    ByteModel,
    PrefixTrie,
    byte_tokenizer,
    generate,
)
from .admission import Admitted, admit, parallel_sample_num, parallel_sampling_error, rid_error
from .constraints import request_grammar
from .detokenizer import text_after_each_send
from .responses import aborted_before_prefill, logprob_meta
from .routes import HTTPError, SchedulerAbort, make_handler
from .sessions import SchedulerCrash, Sessions
from .stream import LiveStreams, batch_stream_chunks, stream_chunks

__all__ = ["BOS_ID", "EOS_ID", "VOCAB_SIZE", "FAIL_MODES", "ByteModel", "StandInServer", "byte_tokenizer",
           "unused_port"]

FAIL_MODES = ("500", "429", "400", "503", "abort", "disconnect", "hang", "nan")
PER_ITEM_FIELDS = ("sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num")
PLUGIN_ENV = "FORERUN_SGLANG_PLUGIN"
"""The environment switch of the real plugin (`backends/sglang_plugin.py`); the stand-in's CLI reads it too."""


@dataclass
class _Failure:
    mode: str
    times: int


@dataclass
class GenerateAnswer:
    """What a /generate answers: its JSON response, or a streamed one's chunks (`stream.stream_chunks`)."""

    response: Any
    chunks: list[dict[str, Any]] | None = None


class StandInServer:
    """A ThreadingHTTPServer on 127.0.0.1 (random port unless `port` is given) that answers like SGLang 0.5.23; a
    context manager: `with StandInServer() as srv: backend = SGLangServerBackend(srv.url, ...)`."""

    def __init__(self, *, model: ByteModel | None = None, plugin: bool = False, deterministic: bool = True,
                 sampling_backend: str | None = None, step_s: float = 0.0,
                 model_path: str = "forerun-standin-byte-model", tokenizer_path: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, serial: bool = False, context_length: int = 32768) -> None:
        self.model = model or ByteModel()
        self.context_length = context_length  # SGLang's model_config.context_len
        self.serial = serial
        """Serve one /generate at a time (a worker at capacity: two chains on it take twice as long)."""
        self._serial_lock = threading.Lock()
        self.host = host
        self.port = port
        self.tokenizer = byte_tokenizer()
        self.plugin = plugin
        self.deterministic = deterministic
        self.sampling_backend = sampling_backend or ("pytorch" if deterministic else "flashinfer")
        self.step_s = step_s
        self.stream_step_s = 0.002
        """Pause between the chunks of a streamed /generate (`stream`): children start mid-stream."""
        self.aborted_rids: set[str] = set()  # every rid /abort_request named (a record; `live_streams` acts on it)
        self.live_streams = LiveStreams()
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path
        self._tokenizer_dir: tempfile.TemporaryDirectory | None = None
        self.requests: list[tuple[str, Any]] = []
        self.request_headers: list[tuple[str, dict[str, str]]] = []
        self.crashed: str | None = None
        """Why the server is down (a request real SGLang crashes on); None while it serves."""
        self.cache = PrefixTrie()
        self.sessions = Sessions(BOS_ID)
        self.counters = {"prompt_tokens_total": 0, "cached_tokens_total": 0, "generation_tokens_total": 0,
                         "num_requests_total": 0}
        self.flushes = 0
        self.routing_counts: dict[str, int] = {}
        """/generate requests per `X-SMG-Routing-Key` header ("" without one): which chains this worker served
        behind a gateway (`GET /forerun_standin/routing`, a route of the stand-in only; SGLang has no such route)."""
        self._in_flight = 0
        self._failures: list[_Failure] = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self._seed_rng = np.random.default_rng(12345)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("StandInServer is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "StandInServer":
        if self.tokenizer_path is None:
            self._tokenizer_dir = tempfile.TemporaryDirectory(prefix="forerun-standin-tokenizer-")
            self.tokenizer.save_pretrained(self._tokenizer_dir.name)
            self.tokenizer_path = self._tokenizer_dir.name
        self._httpd = ThreadingHTTPServer((self.host, self.port), make_handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="standin-sglang", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._tokenizer_dir is not None:
            self._tokenizer_dir.cleanup()
            self._tokenizer_dir = None

    def __enter__(self) -> "StandInServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- controls (tests) ----------------------------------------------------------------------
    def fail(self, mode: str, times: int = 1) -> None:
        """Make the next `times` /generate requests fail with `mode` (one of FAIL_MODES)."""
        if mode not in FAIL_MODES:
            raise ValueError(f"fail mode must be one of {FAIL_MODES}, got {mode!r}")
        if times < 1:
            raise ValueError(f"times must be >= 1, got {times}")
        with self.lock:
            self._failures.append(_Failure(mode, times))

    def take_failure(self) -> str | None:
        with self.lock:
            while self._failures and self._failures[0].times <= 0:
                self._failures.pop(0)
            if not self._failures:
                return None
            f = self._failures[0]
            f.times -= 1
            return f.mode

    def in_flight(self) -> int:
        """/generate requests running now (the scheduler's running + waiting requests)."""
        with self.lock:
            return self._in_flight

    def generate_bodies(self) -> list[dict[str, Any]]:
        """The recorded /generate request bodies, in arrival order."""
        with self.lock:
            return [body for path, body in self.requests if path == "/generate"]

    def server_info(self) -> dict[str, Any]:
        info = {
            "model_path": self.model_path, "tokenizer_path": self.tokenizer_path, "served_model_name": self.model_path,
            "version": "0.5.23-forerun-standin", "enable_metrics": True, "enable_session_radix_cache": True,
            "enable_deterministic_inference": self.deterministic, "sampling_backend": self.sampling_backend,
            "internal_states": [{"vocab_size": VOCAB_SIZE}], "frontend": "python",
        }
        if self.plugin:
            info["forerun_plugin"] = {"version": 2, "keys": ["output_token_logp0", "output_token_entropy",
                                                             "output_token_logq_by_temperature"]}
        return info

    def metrics_text(self) -> str:
        lines = []
        for key, val in self.counters.items():
            lines.append(f"# TYPE sglang:{key} counter")
            lines.append(f'sglang:{key}{{model_name="{self.model_path}"}} {float(val)}')
        return "\n".join(lines) + "\n"

    # -- /generate --------------------------------------------------------------------------
    def handle_generate(self, body: Any) -> GenerateAnswer:
        with self.lock:
            self._in_flight += 1
        try:
            if self.serial:
                with self._serial_lock:
                    return self._handle_generate(body)
            return self._handle_generate(body)
        finally:
            with self.lock:
                self._in_flight -= 1

    def _handle_generate(self, body: Any) -> GenerateAnswer:
        if not isinstance(body, dict):
            raise HTTPError(400, "request body must be a JSON object")
        if body.get("input_ids") is not None:
            ids_field = body["input_ids"]
            batched = bool(ids_field) and isinstance(ids_field[0], list)
            prompts = ids_field if batched else [ids_field]
        elif body.get("text") is not None:
            batched = isinstance(body["text"], list)
            texts = body["text"] if batched else [body["text"]]
            prompts = [self.tokenizer.encode(t) for t in texts]
        else:
            raise HTTPError(400, "Either text, input_ids or input_embeds should be provided.")
        samples = parallel_sample_num(body.get("sampling_params"))
        batched = batched or samples > 1  # a single request with n > 1 becomes a batch of one
        refused = parallel_sampling_error(body, samples) if batched and samples != 1 else None
        if refused is not None:
            raise refused
        n = len(prompts)

        def item(key: str, default: Any, i: int) -> Any:
            val = body.get(key, default)
            if val is None:
                return default
            if batched and isinstance(val, list):  # GenerateReqInput.__getitem__: val[i], extra entries unread
                return val[i] if val[i] is not None else default
            return val

        if batched and any(isinstance(body.get(k), list) and len(body[k]) < n for k in PER_ITEM_FIELDS):
            raise HTTPError(500, "Internal Server Error")  # _init_req_state's obj[i]: an IndexError, not caught
        stream = bool(body.get("stream"))
        duplicate = rid_error(body.get("rid"))
        if duplicate:
            raise HTTPError(400, duplicate)
        admitted = [  # every item checked before any runs (`admission`)
            admit(self.tokenizer, ids, item("sampling_params", {}, i) or {}, context_length=self.context_length,
                  deterministic=self.deterministic, fresh_seed=self._fresh_seed)
            for i, ids in enumerate(prompts)]
        if batched and body.get("session_params") is None:
            self._abort_a_batch([(r, bool(item("return_logprob", False, i)), int(item("logprob_start_len", -1, i)))
                                 for i, r in enumerate(admitted)])
        outs = []
        for i, request in enumerate(admitted):
            rid = self._item_rid(body.get("rid"), i, n, batched)
            run = functools.partial(
                self._generate_one, session=body.get("session_params"),
                return_logprob=bool(item("return_logprob", False, i)),
                logprob_start_len=int(item("logprob_start_len", -1, i)),
                top_logprobs_num=int(item("top_logprobs_num", 0, i)),
                return_text=bool(body.get("return_text_in_logprobs", False)), stream=stream)
            outs.extend(self._samples(request, rid, samples, run))
        if batched:
            return GenerateAnswer([out for out, _ in outs], batch_stream_chunks(outs) if stream else None)
        out, sends = outs[0]
        return GenerateAnswer(out, list(stream_chunks(out, sends)) if stream else None)

    def _abort_a_batch(self, items: list[tuple[Admitted, bool, int]]) -> None:
        """A batch (no session) whose item its scheduler aborts before the prefill (logprob_start_len past the
        prompt, a bad grammar) fails with the first abort (HTTP 400: `_collect_batch_responses`), yet SGLang sent
        every item: the others are prefilled (prompts cached), then aborted before decoding a token or two."""
        aborts: list[SchedulerAbort | None] = []
        for request, return_logprob, logprob_start_len in items:
            try:
                if return_logprob and logprob_start_len > len(request.ids):
                    raise logprob_start_abort(logprob_start_len, len(request.ids))
                request_grammar(request.sp)
                aborts.append(None)
            except SchedulerAbort as aborted:
                aborts.append(aborted)
        if not any(aborts):
            return
        for (request, _, _), aborted in zip(items, aborts):
            if aborted is None:
                cached = min(self.cache.match(request.ids), prefix_match_limit(len(request.ids), False, -1))
                self.cache.insert(request.ids)
                with self.lock:
                    self.counters["prompt_tokens_total"] += len(request.ids)
                    self.counters["cached_tokens_total"] += cached
                    self.counters["num_requests_total"] += 1
        raise next(a for a in aborts if a is not None)

    def _samples(self, request: Admitted, rid: str, samples: int, run: Any) -> list[Any]:
        """One prompt's outputs (`run` answers one request): itself; with n > 1 as tokenizer_manager's
        _handle_batch_request runs it, a prefill-only warm-up of the prompt (its prefix cached for the samples), then
        n samples, each a request of its own with a fresh rid (fresh noise too, unless the seed is used)."""
        if samples <= 1:
            return [run(request, rid=rid)]
        run(replace(request, rules=replace(request.rules, max_new_tokens=0)), rid=uuid.uuid4().hex)
        return [run(request if self.deterministic else replace(
                    request, sampling=replace(request.sampling, seed=self._fresh_seed())), rid=uuid.uuid4().hex)
                for _ in range(samples)]

    @staticmethod
    def _item_rid(rid: Any, i: int, n: int, batched: bool) -> str:
        """Item i's rid as SGLang's `_normalize_rid` makes it (one string for a batch: rid_i; a list of another
        length: 400)."""
        if isinstance(rid, list) and batched and len(rid) != n:
            raise HTTPError(400, "The specified rids length mismatch with the batch_size for batch processing.")
        return (rid[i] if isinstance(rid, list) else (f"{rid}_{i}" if batched and rid else rid)) or uuid.uuid4().hex

    def _session_prompt(self, session: Any, rid: str, ids: list[int], max_new: int) -> tuple[list[int], str]:
        """The ids a request runs on, and an abort message ("" when none)."""
        if not isinstance(session, dict) or session.get("id") is None:
            return ids, ""
        if session["id"] not in self.sessions:
            raise SchedulerAbort(400, f"Invalid request: session id {session['id']} does not exist")
        try:
            full, abort = self.sessions.create(session, rid, ids, max_new)
        except SchedulerCrash as crash:
            with self.lock:
                self.crashed = str(crash)
            raise
        return (full if full is not None else ids), abort

    def _generate_one(self, request: Admitted, *, rid: str, session: Any, return_logprob: bool,
                      logprob_start_len: int, top_logprobs_num: int, return_text: bool, stream: bool
                      ) -> tuple[dict[str, Any], list[tuple[int, str]]]:
        """One admitted request's response and its sends (output tokens, text so far: a stream's chunks)."""
        ids, sp, sampling, rules = request.ids, request.sp, request.sampling, request.rules
        tok = self.tokenizer

        def text_of(t: int) -> str | None:
            return tok.decode([t]) if return_text else None

        try:  # the scheduler's checks before the prefill (handle_generate_request, the grammar manager)
            ids, abort = self._session_prompt(session, rid, list(ids), rules.max_new_tokens)
            cap = max(0, self.context_length - 2 - len(ids))  # init_req_max_new_tokens: max_req_len - input_len - 1
            if rules.max_new_tokens > cap:
                rules = replace(rules, max_new_tokens=cap)
                sampling = replace(sampling, min_new_tokens=min(sampling.min_new_tokens, cap))
            if abort:  # an abort with status 400: the server answers HTTP 400 with its message
                raise SchedulerAbort(400, abort)
            if return_logprob and logprob_start_len > len(ids):
                raise logprob_start_abort(logprob_start_len, len(ids))
            grammar = request_grammar(sp)
        except SchedulerAbort as aborted:
            aborted.output = aborted_before_prefill(self.model, self.tokenizer, request, rid, aborted, return_logprob,
                                                    top_logprobs_num)
            raise
        temps = self._plugin_temperatures(sp)
        cached = min(self.cache.match(ids), prefix_match_limit(len(ids), return_logprob, logprob_start_len))
        gen = generate(self.model, ids, sampling, rules, top_logprobs_num, text_of, temps or (), self.step_s, grammar)
        self.cache.insert(list(ids) + gen.ids)
        if isinstance(session, dict) and session.get("id") is not None:
            self.sessions.finish(session["id"], rid, gen.ids)
        with self.lock:
            self.counters["prompt_tokens_total"] += len(ids)
            self.counters["cached_tokens_total"] += cached
            self.counters["generation_tokens_total"] += len(gen.ids)
            self.counters["num_requests_total"] += 1
        meta: dict[str, Any] = {
            "id": rid, "finish_reason": gen.finish, "prompt_tokens": len(ids), "weight_version": "default",
            "num_retractions": 0, "reasoning_tokens": 0, "completion_tokens": len(gen.ids), "cached_tokens": cached,
            "e2e_latency": 0.0,
        }
        if return_logprob:
            meta.update(logprob_meta(self.model, ids, gen, logprob_start_len, top_logprobs_num, text_of))
        if temps is not None:  # customized_info keys, one value per generated token (tokenizer_manager)
            meta["output_token_logp0"] = gen.logp0
            meta["output_token_entropy"] = gen.entropy
            meta["output_token_logq_by_temperature"] = gen.logq_by_temp
        points = rules.send_points(gen.ids, stream)
        texts = text_after_each_send(tok, ids, gen.ids, points, gen.finish, bool(sp.get("no_stop_trim", False)))
        return {"text": texts[-1], "output_ids": gen.ids, "meta_info": meta}, list(zip(points, texts))

    def _plugin_temperatures(self, sp: dict[str, Any]) -> list[float] | None:
        """None unless the plugin runs and the request switched it on; else its extra temperatures."""
        custom = sp.get("custom_params") or {}
        if not (self.plugin and isinstance(custom, dict) and custom.get("forerun_plugin")):
            return None
        return [float(t) for t in custom.get("forerun_logq_temperatures") or []]

    def _fresh_seed(self) -> int:
        """A seed for a request whose sampling_seed the server ignores (not deterministic: fresh noise)."""
        with self.lock:
            return int(self._seed_rng.integers(0, 2**62))

def logprob_start_abort(logprob_start_len: int, prompt_len: int) -> SchedulerAbort:
    """The scheduler's abort of a logprob_start_len past the prompt (handle_generate_request)."""
    return SchedulerAbort(400, f"req.logprob_start_len={logprob_start_len} is higher than the number of input tokens "
                               f"len(req.origin_input_ids)={prompt_len}. Please use a smaller logprob_start_len.")


def prefix_match_limit(prompt_len: int, return_logprob: bool, logprob_start_len: int) -> int:
    """The most prompt tokens SGLang takes from its radix cache (`Req._compute_max_prefix_len`): all but the last
    (whose logits the request needs), and none past logprob_start_len when the request returns logprobs from there;
    `cached_tokens` is that prefix."""
    limit = prompt_len - 1
    if return_logprob and logprob_start_len >= 0:
        limit = min(limit, logprob_start_len)
    return max(limit, 0)


def unused_port() -> int:
    """A local TCP port nothing listens on (for connection-refused tests)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m forerun.runtime_ext.standin.server --port P [--enable-deterministic-inference]` (the same
    flag as sglang.launch_server; other sglang flags are accepted and ignored).  The plugin is on when
    FORERUN_SGLANG_PLUGIN=1, as for the real plugin.  `--step-ms` sleeps per decode step."""
    import argparse

    parser = argparse.ArgumentParser(description="stand-in SGLang server (tests / launcher checks / scale-out bench)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--model-path", default="forerun-standin-byte-model")
    parser.add_argument("--enable-deterministic-inference", action="store_true")
    parser.add_argument("--step-ms", type=float, default=float(os.environ.get("FORERUN_STANDIN_STEP_MS", "0")))
    parser.add_argument("--serial", action="store_true", default=os.environ.get("FORERUN_STANDIN_SERIAL") == "1",
                        help="serve one /generate at a time (a worker at capacity)")
    args, _unknown = parser.parse_known_args(argv)
    srv = StandInServer(host=args.host, port=args.port, model_path=args.model_path,
                        deterministic=args.enable_deterministic_inference,
                        plugin=os.environ.get(PLUGIN_ENV) == "1", step_s=args.step_ms / 1000.0, serial=args.serial)
    srv.start()
    mode = "deterministic" if srv.deterministic else "NOT deterministic (seeds ignored)"
    print(f"stand-in SGLang server on {srv.url}: {mode}, plugin {'on' if srv.plugin else 'off'}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
