"""The SGLang server as a forerun `Engine`: a token-exact HTTP client for a launched SGLang 0.5.23 server
(`python -m sglang.launch_server`); `server.SGLangServerBackend` puts the frontend on top of it.

Requests are token ids: `POST /generate` always carries `input_ids` (never re-tokenized text; see
`token_exact`); bodies and responses are built and read in `server_wire`.  Per-token quantities:

    paper                     code (GenerateOutput / meta_info key)   how it is obtained
    log q_τ(y_t | ·)          output_logq  / output_token_logprobs    pass 1: generate at τ, return_logprob
    log p0(y_t | ·)           output_logp0 / output_token_logp0       the plugin (one pass), else pass 2:
                                                                      score prompt + output
    top-k of p0 per token     output_top_logprobs                     pass 2's input_top_logprobs[1:] (the
                                                                      server's top-k, of q_τ: ..._q)
    H(p0(· | y_<t))           output_entropy / output_token_entropy   ONLY from the forerun plugin
                                                                      (`sglang_plugin`); else None
    log q_τ'(y_t | ·), τ' ∈ 𝒯 output_token_logq_by_temperature       ONLY from the plugin (MultiTryMH)
    log p0 of prompt tokens   input_logp0 / input_token_logprobs      pass 1, from logprob_start_len
                                                                      (entry 0 is [None, id, text])

Pass 2 is the exact two-pass recipe: max_new_tokens=0, logprob_start_len = len(prompt) - 1, log p0 of the
output = input_token_logprobs[1:] (SGLang shift).  It is skipped when the plugin serves the request, and at
τ = 0 and τ = 1, where SGLang's reported logprobs are log p0 already
(`ServerConfig.reuse_logq_at_unit_temperature`) - unless its penalizers changed the logits first (min_new_tokens,
frequency / presence penalties: `penalized_logits`; nor does the plugin serve those).  The radix cache makes pass
2 re-prefill only the suffix.
A session request's pass 2 scores the full prompt the server built (`server_sessions`), without the session.
`cached_tokens` is pass 1's `meta_info.cached_tokens`; pass 2's is in `meta_info["logp0_pass"]`.

At connect the client reads /server_info (`ServerCapabilities`): a seeded request on a server without
`--enable-deterministic-inference` is refused (the server would ignore the seed; not a scoring one) unless
`ServerConfig.allow_nondeterministic`.  On a deterministic server an unseeded request would sample with seed 42
(SGLang's default there, `srt/sampling/sampling_batch_info.py`), so every unseeded request would draw the same
tokens: the client sends it a fresh random seed instead.  `meta_info["sampling_seed"]` records the seed the
server sampled with (the request's own or the fresh one; None on a server that ignores seeds).  Session
parameters real SGLang crashes on or refuses (`replace=True` without `rid`) are refused before sending
(`server_wire.check_session`).

Errors (connection refused, timeout, HTTP 4xx/5xx, abort, a NaN logprob) raise `SGLangServerError` naming the
URL and the request (rid, prompt length).  Connection errors, 5xx and 429 are retried with bounded exponential
backoff; read timeouts (`ServerConfig.timeout_s`, the CLI's `--request-timeout`) are not retried (the server
may still be running the request).  `/flush_cache` is sent only when asked and waits for the server to be idle.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Sequence

import requests

from ..protocol import EngineError, GenerateOutput, SamplingParams
from .server_config import (NONDETERMINISTIC_NOTE, ROUTING_KEY_HEADER, TRANSIENT_STATUS, ServerConfig,
                            check_server_url)
from .server_sessions import SessionMirror
from .server_stream import ServerStreamingMixin
from .server_wire import (
    ENTROPY_KEY,
    LOGP0_KEY,
    SGLangServerError,
    ServerCapabilities,
    Where,
    WireRequest,
    check_generate_response,
    check_request,
    check_session,
    describe,
    error_text,
    finite_logprobs,
    fresh_seed,
    generate_body,
    logp0_from_score,
    penalized_logits,
    plugin_fields,
    top_logprobs_read,
    wire_priority,
)

__all__ = ["SGLangServerClient", "ServerConfig", "SGLangServerError", "ServerCapabilities", "NONDETERMINISTIC_NOTE",
           "ROUTING_KEY_HEADER"]


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer  # a dependency; imported here to keep it out of argument parsing

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:
        raise EngineError(f"cannot load a tokenizer from {path!r} (reported by the SGLang server); "
                          "pass tokenizer=<HF tokenizer or local path> to SGLangServerBackend") from e


class SGLangServerClient(ServerStreamingMixin):
    """The SGLang server as a forerun `Engine` (generate / generate_batch / flush_cache / server_info) and a
    `protocol.StreamingEngine` (`server_stream`)."""

    def __init__(self, base_url: str, tokenizer: Any = None, *, config: ServerConfig | None = None,
                 http: requests.Session | None = None) -> None:
        try:
            self.base_url = check_server_url(base_url)
        except ValueError as exc:
            raise ValueError(f"base_url: {exc}") from None
        self.config = config or ServerConfig()
        self._http = http or requests.Session()
        self.default_session_params: dict[str, Any] | None = None
        self.routing_key: str | None = None
        """Sent as `ROUTING_KEY_HEADER` on every request when set (see `with_routing_key`)."""
        info = self.server_info()
        self.capabilities = ServerCapabilities.from_info(info)
        if self.config.use_plugin and self.capabilities.plugin is None:
            raise EngineError(f"SGLang server {self.base_url} does not run the forerun sampler plugin "
                              "(use_plugin=True); launch it with scripts/launch_runtime --plugin")
        if tokenizer is None:
            path = info.get("tokenizer_path") or info.get("model_path")
            if not path:
                raise EngineError(f"SGLang server {self.base_url} reports no tokenizer_path/model_path; "
                                  "pass tokenizer= explicitly")
            tokenizer = _load_tokenizer(path)
        elif isinstance(tokenizer, str):  # the caller's (--tokenizer): bad input, not a server failure
            try:
                tokenizer = _load_tokenizer(tokenizer)
            except EngineError as exc:
                cause = exc.__cause__ or exc
                first = (str(cause).strip().splitlines() or [""])[0]
                raise ValueError(f"cannot load the given tokenizer {tokenizer!r} ({type(cause).__name__}: {first})"
                                 ) from None
        self.tokenizer = tokenizer
        self.sessions = SessionMirror(getattr(tokenizer, "bos_token_id", None))

    @property
    def deterministic(self) -> bool:
        """Seeds are honoured: the server runs with --enable-deterministic-inference."""
        return self.capabilities.deterministic

    @property
    def plugin_enabled(self) -> bool:
        """Requests ask the forerun sampler plugin for log p0, entropy and log q at extra temperatures."""
        return self.capabilities.plugin is not None and self.config.use_plugin is not False

    def with_routing_key(self, key: str | None) -> "SGLangServerClient":
        """The same client (HTTP session, capabilities, session mirror, tokenizer shared) whose every request
        carries `key` in `ROUTING_KEY_HEADER`: one per chain, so a gateway keeps the chain on one worker."""
        view = copy.copy(self)
        view.routing_key = key
        return view

    def routing_headers(self) -> dict[str, str] | None:
        """The headers every request of this client carries: the routing key, when set."""
        return {ROUTING_KEY_HEADER: self.routing_key} if self.routing_key else None

    # -- HTTP -------------------------------------------------------------------------------
    def _request(self, method: str, path: str, *, json_body: Any = None, rids: Sequence[str] = (),
                 prompt_lens: Sequence[int] = (), params: dict[str, Any] | None = None) -> requests.Response:
        """One HTTP call with bounded retries of transient failures; raises SGLangServerError."""
        url = self.base_url + path
        cfg = self.config
        what = f" for {describe(rids, prompt_lens)}" if rids else ""
        attempts = 0
        while True:
            attempts += 1
            transient: str | None = None
            status: int | None = None
            try:
                resp = self._http.request(method, url, json=json_body, params=params,
                                          headers=self.routing_headers(),
                                          timeout=(cfg.connect_timeout_s, cfg.timeout_s))
            except requests.exceptions.ConnectionError as e:
                transient = f"cannot connect ({type(e).__name__}: {e})"
            except requests.exceptions.Timeout as e:
                raise SGLangServerError(
                    f"SGLang server {url} timed out after {cfg.timeout_s:g} s{what} ({type(e).__name__})",
                    url=url, rids=rids, prompt_lens=prompt_lens, attempts=attempts) from e
            except requests.exceptions.RequestException as e:
                raise SGLangServerError(f"SGLang server {url} request failed{what}: {e}", url=url, rids=rids,
                                        prompt_lens=prompt_lens, attempts=attempts) from e
            else:
                if resp.status_code < 400:
                    return resp
                status = resp.status_code
                reason = f"HTTP {status}: {error_text(resp)}"
                if status not in TRANSIENT_STATUS:
                    raise SGLangServerError(f"SGLang server {url} rejected the request{what}: {reason}", url=url,
                                            rids=rids, prompt_lens=prompt_lens, status=status, attempts=attempts)
                transient = reason
            if attempts > cfg.retries:
                raise SGLangServerError(
                    f"SGLang server {url} failed{what} after {attempts} attempt(s): {transient}",
                    url=url, rids=rids, prompt_lens=prompt_lens, status=status, attempts=attempts)
            time.sleep(cfg.backoff(attempts - 1))

    # -- server state -----------------------------------------------------------------------
    def server_info(self) -> dict[str, Any]:
        """GET /server_info (falls back to the deprecated /get_server_info)."""
        for path in ("/server_info", "/get_server_info"):
            try:
                resp = self._request("GET", path)
                break
            except SGLangServerError as e:
                if e.status != 404:
                    raise
        else:  # neither: not an SGLang server (its 404 page, HTML, used to be the whole message)
            raise SGLangServerError(f"{self.base_url} is not an SGLang server: GET /server_info and /get_server_info "
                                    "both answered 404", url=self.base_url, status=404)
        try:
            info = resp.json()
        except ValueError as e:  # requests' JSONDecodeError
            raise SGLangServerError(f"SGLang server {self.base_url}{path} answered invalid JSON ({e}): "
                                    f"{resp.text.strip()[:80]!r}", url=self.base_url + path) from None
        if not isinstance(info, dict):
            raise SGLangServerError(f"SGLang server {self.base_url}{path} returned {type(info).__name__}, "
                                    "expected an object", url=self.base_url + path)
        return info

    @functools.cached_property
    def max_context(self) -> int | None:
        """The served model's context length in tokens (`max_model_len` of GET /v1/models: SGLang refuses a request
        longer than that), None where the server does not say."""
        try:
            cards = self._request("GET", "/v1/models").json().get("data")
            length = cards[0].get("max_model_len")
        except (SGLangServerError, ValueError, AttributeError, IndexError, KeyError, TypeError):
            return None
        return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None

    def health(self) -> bool:
        """True when GET /health answers 200 (no retries)."""
        try:
            return self._http.get(self.base_url + "/health", timeout=self.config.connect_timeout_s).status_code == 200
        except requests.exceptions.RequestException:
            return False

    def flush_cache(self, wait_s: float | None = None) -> bool:
        """POST /flush_cache, waiting for the server to be idle: SGLang flushes only when no request runs or
        waits and otherwise answers 400.  Each try asks the server to defer the flush until idle (`?timeout=`,
        srt/managers/scheduler_components/flush_wrapper.py); a 400 is retried with backoff until `wait_s`
        (default `ServerConfig.flush_wait_s`) has passed.  True once flushed, False when the server stayed busy."""
        deadline = time.monotonic() + (self.config.flush_wait_s if wait_s is None else wait_s)
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            try:
                self._request("POST", "/flush_cache", params={"timeout": round(max(0.0, min(left, 5.0)), 3)})
                return True
            except SGLangServerError as e:
                if e.status != 400:
                    raise
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, self.config.backoff(attempt), 1.0))
            attempt += 1

    def metrics(self) -> dict[str, float]:
        """GET /metrics (needs --enable-metrics): `sglang:*` samples summed over their labels."""
        text = self._request("GET", "/metrics").text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line.startswith("sglang:"):
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                continue
        return out

    def open_session(self, capacity_of_str_len: int, *, session_id: str | None = None) -> str:
        """POST /open_session -> the session id (for `session_params={"id": ...}`)."""
        if capacity_of_str_len <= 0:
            raise ValueError(f"capacity_of_str_len must be > 0, got {capacity_of_str_len}")
        body: dict[str, Any] = {"capacity_of_str_len": int(capacity_of_str_len)}
        if session_id is not None:
            body["session_id"] = session_id
        sid = self._request("POST", "/open_session", json_body=body).json()
        if not isinstance(sid, str):
            raise SGLangServerError(f"SGLang server {self.base_url}/open_session returned {sid!r}, expected an id",
                                    url=self.base_url + "/open_session")
        self.sessions.opened(sid)
        return sid

    def close_session(self, session_id: str) -> None:
        """POST /close_session."""
        self._request("POST", "/close_session", json_body={"session_id": session_id})
        self.sessions.closed(session_id)

    @contextlib.contextmanager
    def session_params(self, params: dict[str, Any]) -> Iterator[None]:
        """Send `session_params` with every generation request issued inside this block (not the scoring
        pass).  Instance-wide, not per thread: do not mix sessions in concurrent programs on one backend."""
        check_session(self.base_url, None, params)
        old, self.default_session_params = self.default_session_params, dict(params)
        try:
            yield
        finally:
            self.default_session_params = old

    # -- /generate --------------------------------------------------------------------------
    def _post_generate(self, items: list[WireRequest], *, batched: bool) -> list[dict[str, Any]]:
        """One POST /generate for one request (batched=False) or a list of them (batched=True)."""
        rids = [it.rid for it in items]
        lens = [len(it.ids) for it in items]
        url = self.base_url + "/generate"
        for it in items:
            if len(it.ids) == 0:
                raise SGLangServerError(f"SGLang server {url}: empty prompt for rid={it.rid}", url=url,
                                        rids=[it.rid], prompt_lens=[0])
        resp = self._request("POST", "/generate", json_body=generate_body(items, batched), rids=rids,
                             prompt_lens=lens)
        try:
            data = resp.json()
        except (ValueError, json.JSONDecodeError) as e:
            raise SGLangServerError(f"SGLang server {url} returned non-JSON for {describe(rids, lens)}: "
                                    f"{resp.text[:200]!r}", url=url, rids=rids, prompt_lens=lens) from e
        outs = data if batched else [data]
        check_generate_response(url, data, outs, rids, lens)
        return outs

    def _send(self, items: list[WireRequest], *, batched: bool) -> list[dict[str, Any]]:
        if not items:
            return []
        if batched and len(items) > 1:
            if self.config.batch_mode == "batched" and all(it.session is None for it in items) \
                    and len({it.priority for it in items}) == 1:
                return self._post_generate(items, batched=True)
            workers = min(self.config.max_concurrency, len(items))
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sglang-req") as pool:
                return [r[0] for r in pool.map(lambda it: self._post_generate([it], batched=False), items)]
        return [self._post_generate([it], batched=False)[0] for it in items]

    def generate(self, input_ids: Sequence[int], params: SamplingParams, *, rid: str | None = None,
                 priority: int = 0, session_params: dict[str, Any] | None = None) -> GenerateOutput:
        """One request (two passes when log p0 is needed and the plugin does not serve it).  A non-zero
        `priority` is sent as SGLang's `priority` (honoured only with --enable-priority-scheduling)."""
        return self._generate_many([(input_ids, params)], rids=[rid], priority=priority,
                                   session_params=session_params, batched=False)[0]

    def generate_batch(self, requests_: Sequence[tuple[Sequence[int], SamplingParams]], *,
                       priority: int = 0) -> list[GenerateOutput]:
        """Several requests together: one batched /generate (or concurrent ones, see `ServerConfig.batch_mode`)."""
        return self._generate_many(requests_, rids=[None] * len(requests_), priority=priority,
                                   session_params=None, batched=True)

    def _wire_request(self, ids: Sequence[int], p: Any, rid: str | None, session: dict[str, Any] | None,
                      priority: int) -> WireRequest:
        """Check one request against what the server can do (seeds, plugin, its own limits)."""
        if not isinstance(p, SamplingParams):
            raise TypeError(f"params must be forerun SamplingParams, got {type(p).__name__}")
        rid = rid or uuid.uuid4().hex
        sampled = p.seed is not None and p.max_new_tokens > 0  # a scoring request draws nothing: its seed is moot
        if sampled and not self.deterministic and not self.config.allow_nondeterministic:
            raise SGLangServerError(
                f"SGLang server {self.base_url} runs without --enable-deterministic-inference, so it ignores "
                f"sampling_seed (rid={rid}): relaunch it with --enable-deterministic-inference "
                "(scripts/launch_runtime passes it), or pass --allow-nondeterministic to accept chains that are "
                "equal in law only", url=self.base_url, rids=[rid], prompt_lens=[len(ids)])
        if p.logprob_temperatures and penalized_logits(p):
            raise SGLangServerError(
                f"{self.base_url}: request rid={rid} asks for log q at extra temperatures with "
                f"{', '.join(penalized_logits(p))}; SGLang's penalizers change the logits the sampler plugin reads "
                "(min_new_tokens masks EOS and the stop ids, the frequency / presence penalties subtract from seen "
                "tokens), so those values would not be of p0: drop them, or run on the embedded engine",
                url=self.base_url, rids=[rid], prompt_lens=[len(ids)])
        if p.logprob_temperatures and not self.plugin_enabled:
            raise SGLangServerError(
                f"{self.base_url}: request rid={rid} asks for log q at extra temperatures "
                f"{p.logprob_temperatures} (MultiTryMH's mixture proposal); a stock SGLang server returns log q "
                "only at the sampled temperature: launch it with scripts/launch_runtime --plugin (the forerun "
                "sampler plugin), or run MultiTryMH on the embedded engine",
                url=self.base_url, rids=[rid], prompt_lens=[len(ids)])
        check_request(self.base_url, rid, p, self.capabilities)
        check_session(self.base_url, rid, session)
        if p.seed is None and self.deterministic and p.max_new_tokens > 0:
            p = dataclasses.replace(p, seed=fresh_seed())  # else the server samples it with seed 42
        # SGLang's penalizers change the logits the plugin reads: log p0 then comes from pass 2
        plugin = self.plugin_enabled and p.return_logprob and p.max_new_tokens > 0 and not penalized_logits(p)
        return WireRequest([int(t) for t in ids], p, rid, session, wire_priority(priority, self.capabilities), plugin)

    def _generate_many(self, reqs: Sequence[tuple[Sequence[int], SamplingParams]], *, rids: Sequence[str | None],
                       priority: int, session_params: dict[str, Any] | None, batched: bool) -> list[GenerateOutput]:
        session = session_params if session_params is not None else self.default_session_params
        items = [self._wire_request(ids, p, rid, session, priority) for (ids, p), rid in zip(reqs, rids)]
        fulls = [self._full_prompt(it) for it in items]
        outs = self._send(items, batched=batched)
        for it, full, out in zip(items, fulls, outs):
            self._record_session(it, full, out)
        # pass 2: log p0 of the generated tokens (and top-k of p0) by scoring prompt + output
        need = [i for i, (it, out) in enumerate(zip(items, outs)) if self._needs_logp0_pass(it, out)]
        scores: dict[int, dict[str, Any]] = {}
        if need:
            score_items = [self._logp0_request(items[i], fulls[i], outs[i]) for i in need]
            for i, s in zip(need, self._send(score_items, batched=True)):
                scores[i] = s
        return [self._to_output(it, out, scores.get(i)) for i, (it, out) in enumerate(zip(items, outs))]

    def _needs_logp0_pass(self, it: WireRequest, out: dict[str, Any]) -> bool:
        """Whether the exact recipe's pass 2 (scoring prompt + output for log p0) runs for this request."""
        return bool(self.config.two_pass_logp0 and it.params.return_logprob and out["output_ids"]
                    and not it.plugin and not self._logq_is_logp0(it.params))

    def _logp0_request(self, it: WireRequest, prompt: Sequence[int], out: dict[str, Any]) -> WireRequest:
        """Pass 2: prefill-only scoring of prompt + generated ids, log p0 from the prompt's last position on."""
        full = [int(t) for t in prompt] + [int(t) for t in out["output_ids"]]
        sp = SamplingParams(max_new_tokens=0, temperature=1.0, return_logprob=True,
                            logprob_start_len=len(prompt) - 1, top_logprobs_num=it.params.top_logprobs_num)
        return WireRequest(full, sp, f"{it.rid}-logp0", None, it.priority)

    def _full_prompt(self, it: WireRequest) -> list[int]:
        """The ids the server runs: the request's own, or a session request's history + new turn."""
        if it.session is None:
            return it.ids
        full = self.sessions.full_prompt(it.session, it.ids)
        if full is None:
            if it.params.return_logprob and not it.plugin and not self._logq_is_logp0(it.params):
                raise SGLangServerError(
                    f"SGLang server {self.base_url}: rid={it.rid} continues session {it.session.get('id')} "
                    f"(rid {it.session.get('rid')}) whose history this client did not see; its log p0 pass would "
                    "score another context. Open the session through this client.",
                    url=self.base_url, rids=[it.rid], prompt_lens=[len(it.ids)])
            return it.ids
        return full

    def _record_session(self, it: WireRequest, full: list[int], out: dict[str, Any]) -> None:
        if it.session is None:
            return
        served = out["meta_info"].get("prompt_tokens")
        if served is not None and int(served) != len(full) and self.sessions.knows(it.session.get("id")):
            raise SGLangServerError(
                f"SGLang server {self.base_url} ran rid={it.rid} of session {it.session.get('id')} on "
                f"{served} prompt tokens, the client's mirror of the session expected {len(full)}",
                url=self.base_url, rids=[it.rid], prompt_lens=[len(it.ids)])
        self.sessions.record(it.session, it.rid, full, out["output_ids"], it.params.max_new_tokens)

    def _logq_is_logp0(self, p: SamplingParams) -> bool:
        # a constrained request's log q is of the grammar-masked distribution, never log p0; so is a request's
        # whose logits SGLang's penalizers change before its logprobs (`penalized_logits`)
        return (self.config.reuse_logq_at_unit_temperature and p.temperature in (0.0, 1.0) and p.constraint is None
                and not penalized_logits(p))

    def _to_output(self, item: WireRequest, out: dict[str, Any], score: dict[str, Any] | None) -> GenerateOutput:
        ids, p, rid = item.ids, item.params, item.rid
        meta = dict(out["meta_info"])
        for key in ("output_top_logprobs", "input_top_logprobs"):
            if key in meta:
                meta[key] = top_logprobs_read(meta[key])
        output_ids = tuple(int(t) for t in out["output_ids"])
        text = out.get("text")
        if text is None:
            text = self.tokenizer.decode(list(output_ids))
        meta.setdefault("prompt_tokens", len(ids))
        meta.setdefault("completion_tokens", len(output_ids))
        meta.setdefault("cached_tokens", 0)
        meta["sampling_seed"] = p.seed if self.deterministic else None  # the seed the server sampled with
        # SGLang changes the logits before its logprobs: a grammar's mask and its penalizers (`penalized_logits`)
        meta["output_token_logprobs_masked"] = p.constraint is not None or bool(penalized_logits(p))
        logq = logp0 = entropy = input_logp0 = None
        if p.return_logprob:
            where = Where(self.base_url + "/generate", rid, len(ids))
            otl = meta.get("output_token_logprobs")
            if otl is None or len(otl) != len(output_ids):
                raise where.error(f"returned {0 if otl is None else len(otl)} output logprobs for "
                                  f"{len(output_ids)} tokens (rid={rid})")
            logq = finite_logprobs([e[0] for e in otl], "log q (output_token_logprobs)", where)
            itl = meta.get("input_token_logprobs")
            if itl:  # entry 0 is SGLang's shift (None); the rest must be numbers
                first = None if itl[0][0] is None else float(itl[0][0])
                input_logp0 = (first,) + finite_logprobs([e[0] for e in itl[1:]], "prompt log p0", where)
            elif itl is not None:
                input_logp0 = ()
            if item.plugin:
                logp0, entropy = plugin_fields(p, meta, len(output_ids), where)
                meta[LOGP0_KEY], meta[ENTROPY_KEY] = list(logp0), list(entropy)
            else:
                logp0 = self._output_logp0(p, meta, output_ids, logq, score, where)
        return GenerateOutput(input_ids=tuple(ids), output_ids=output_ids, text=text, meta_info=meta,
                              output_logq=logq, output_logp0=logp0, output_entropy=entropy,
                              input_logp0=input_logp0, input_entropy=None)

    def _output_logp0(self, p: SamplingParams, meta: dict[str, Any], output_ids: tuple[int, ...],
                      logq: tuple[float, ...], score: dict[str, Any] | None, where: Where) -> tuple[float, ...] | None:
        """log p0 of the generated tokens without the plugin: the scoring pass, the reported logprobs where
        they already are log p0, nothing to score; sets meta["output_token_logp0"]."""
        for key in (LOGP0_KEY, ENTROPY_KEY):
            meta.pop(key, None)  # only the plugin, when asked, may fill these
        if score is not None:
            logp0 = logp0_from_score(p, meta, output_ids, score["meta_info"], where)
        elif self._logq_is_logp0(p):
            logp0 = logq
        elif not output_ids:
            logp0 = ()
        else:
            return None
        meta[LOGP0_KEY] = list(logp0)
        return logp0
