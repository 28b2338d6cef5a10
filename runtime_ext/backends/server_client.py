"""The SGLang server as a forerun `Engine`: a token-exact HTTP client for a launched SGLang 0.5.23 server
(`python -m sglang.launch_server`); `server.SGLangServerBackend` puts the frontend on top of it.

Requests are token ids: `POST /generate` always carries `input_ids` (never re-tokenized text; see
`token_exact`).  Per-token quantities come from stock server APIs only:

    paper                     code (GenerateOutput / meta_info key)   how it is obtained
    log q_τ(y_t | ·)          output_logq  / output_token_logprobs    pass 1: generate at τ, return_logprob
    log p0(y_t | ·)           output_logp0 / output_token_logp0       pass 2: score prompt + output
    top-k of p0 per token     output_top_logprobs                     pass 2's input_top_logprobs[1:] (the
                                                                      server's top-k, of q_τ: ..._q)
    H(p0(· | y_<t))           output_entropy / output_token_entropy   ONLY from a server plugin, under
                                                                      `ServerConfig.entropy_key`; else None
    log p0 of prompt tokens   input_logp0 / input_token_logprobs      pass 1, from logprob_start_len
                                                                      (entry 0 is [None, id, text])

Pass 2 is the exact two-pass recipe: max_new_tokens=0, logprob_start_len = len(prompt) - 1, log p0 of the
output = input_token_logprobs[1:] (SGLang shift).  It is skipped when a plugin returns log p0 under
`ServerConfig.logp0_key`, and at τ = 0 and τ = 1, where SGLang's reported logprobs are log p0 already
(`ServerConfig.reuse_logq_at_unit_temperature`).  The radix cache makes pass 2 re-prefill only the suffix.  `cached_tokens` is the server's
per-request `meta_info.cached_tokens` of pass 1; pass 2's is in `meta_info["logp0_pass"]`.

Errors (connection refused, timeout, HTTP 4xx/5xx, `finish_reason.type == "abort"`) raise
`SGLangServerError` naming the URL and the request (rid, prompt length).  Connection errors, 5xx and 429
are retried with bounded exponential backoff (`ServerConfig`); read timeouts are not retried (the server
may still be running the request).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple, Sequence

import requests

from ..protocol import EngineError, GenerateOutput, SamplingParams

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})

_Item = tuple[list[int], SamplingParams, str, dict[str, Any] | None, int | None]
"""One request as sent: (input_ids, params, rid, session_params, priority or None)."""


@dataclass(frozen=True)
class ServerConfig:
    """How `SGLangServerClient` talks to the server (transport only; no paper symbols)."""

    timeout_s: float = 600.0
    """Read timeout of one HTTP request in seconds (a long generation must fit); default 600."""
    connect_timeout_s: float = 10.0
    """TCP connect timeout in seconds; default 10."""
    retries: int = 3
    """Extra attempts after a transient failure (connection error, 5xx, 429); 0 disables; default 3."""
    backoff_s: float = 0.5
    """Sleep before the first retry; doubled (`backoff_factor`) each retry; default 0.5 s."""
    backoff_factor: float = 2.0
    """Growth of the backoff per retry; default 2."""
    max_backoff_s: float = 10.0
    """Cap on one backoff sleep; default 10 s."""
    batch_mode: str = "batched"
    """`run_batch`: "batched" (one /generate with input_ids as a list of lists) or "concurrent"
    (one request per item from a thread pool); default "batched"."""
    max_concurrency: int = 64
    """Threads used by batch_mode="concurrent"; default 64."""
    two_pass_logp0: bool = True
    """Run the scoring pass that yields log p0 of generated tokens when return_logprob is set; default True."""
    reuse_logq_at_unit_temperature: bool = True
    """At τ = 0 (greedy) and τ = 1 SGLang's reported output logprobs already are log p0: its sampler takes
    log_softmax(z / τ) before top-k/top-p (`srt/layers/sampler.py`; greedy requests run with τ = 1), so
    pass 2 is skipped and output_token_logp0 = the reported logprobs.  False: always run pass 2.  Default True."""
    logp0_key: str = "output_token_logp0"
    """meta_info key under which a sampler plugin may return log p0 (then pass 2 is skipped)."""
    entropy_key: str = "output_token_entropy"
    """meta_info key under which a sampler plugin may return the entropy of p0 per output token."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s must be > 0, got {self.connect_timeout_s}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.backoff_s < 0:
            raise ValueError(f"backoff_s must be >= 0, got {self.backoff_s}")
        if self.backoff_factor < 1:
            raise ValueError(f"backoff_factor must be >= 1, got {self.backoff_factor}")
        if self.max_backoff_s < 0:
            raise ValueError(f"max_backoff_s must be >= 0, got {self.max_backoff_s}")
        if self.batch_mode not in ("batched", "concurrent"):
            raise ValueError(f"batch_mode must be 'batched' or 'concurrent', got {self.batch_mode!r}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")

    def backoff(self, attempt: int) -> float:
        """Sleep before retry number `attempt` (0-based)."""
        return min(self.max_backoff_s, self.backoff_s * self.backoff_factor**attempt)


class SGLangServerError(EngineError):
    """A request to the SGLang server failed (unreachable, timeout, HTTP error, aborted)."""

    def __init__(self, message: str, *, url: str, rids: Sequence[str] = (), prompt_lens: Sequence[int] = (),
                 status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.url = url
        self.rids = tuple(rids)
        self.prompt_lens = tuple(prompt_lens)
        self.status = status
        self.attempts = attempts


def _describe(rids: Sequence[str], lens: Sequence[int]) -> str:
    if len(rids) == 1:
        return f"rid={rids[0]}, prompt length {lens[0]} tokens"
    shown = ", ".join(f"{r} ({n} tokens)" for r, n in list(zip(rids, lens))[:4])
    more = f", ... {len(rids) - 4} more" if len(rids) > 4 else ""
    return f"batch of {len(rids)} requests: {shown}{more}"


def _error_text(resp: requests.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:300]
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err)[:300]
    return str(body)[:300]


def _load_tokenizer(path: str) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as e:  # pragma: no cover - transformers is a dependency
        raise EngineError("loading the server's tokenizer needs transformers installed") from e
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:
        raise EngineError(
            f"cannot load a tokenizer from {path!r} (reported by the SGLang server); "
            "pass tokenizer=<HF tokenizer or local path> to SGLangServerBackend"
        ) from e


class SGLangServerClient:
    """The SGLang server as a forerun `Engine` (generate / generate_batch / flush_cache / server_info)."""

    def __init__(self, base_url: str, tokenizer: Any = None, *, config: ServerConfig | None = None,
                 http: requests.Session | None = None) -> None:
        base_url = base_url.rstrip("/")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url
        self.config = config or ServerConfig()
        self._http = http or requests.Session()
        self._http_lock = threading.Lock()
        self.default_session_params: dict[str, Any] | None = None
        if tokenizer is None:
            info = self.server_info()
            path = info.get("tokenizer_path") or info.get("model_path")
            if not path:
                raise EngineError(f"SGLang server {self.base_url} reports no tokenizer_path/model_path; "
                                  "pass tokenizer= explicitly")
            tokenizer = _load_tokenizer(path)
        elif isinstance(tokenizer, str):
            tokenizer = _load_tokenizer(tokenizer)
        self.tokenizer = tokenizer

    # -- HTTP -------------------------------------------------------------------------------
    def _request(self, method: str, path: str, *, json_body: Any = None, rids: Sequence[str] = (),
                 prompt_lens: Sequence[int] = ()) -> requests.Response:
        """One HTTP call with bounded retries of transient failures; raises SGLangServerError."""
        url = self.base_url + path
        cfg = self.config
        what = f" for {_describe(rids, prompt_lens)}" if rids else ""
        attempts = 0
        while True:
            attempts += 1
            transient: str | None = None
            status: int | None = None
            try:
                resp = self._http.request(method, url, json=json_body,
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
                reason = f"HTTP {status}: {_error_text(resp)}"
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
        path = "/server_info"
        try:
            resp = self._request("GET", path)
        except SGLangServerError as e:
            if e.status != 404:
                raise
            path = "/get_server_info"
            resp = self._request("GET", path)
        try:
            info = resp.json()
        except ValueError as e:  # requests' JSONDecodeError
            raise SGLangServerError(f"SGLang server {self.base_url}{path} answered invalid JSON ({e}): "
                                    f"{resp.text.strip()[:80]!r}", url=self.base_url + path) from None
        if not isinstance(info, dict):
            raise SGLangServerError(f"SGLang server {self.base_url}{path} returned {type(info).__name__}, "
                                    "expected an object", url=self.base_url + path)
        return info

    def health(self) -> bool:
        """True when GET /health answers 200 (no retries)."""
        try:
            return self._http.get(self.base_url + "/health", timeout=self.config.connect_timeout_s).status_code == 200
        except requests.exceptions.RequestException:
            return False

    def flush_cache(self) -> None:
        """POST /flush_cache (the server skips it while requests are running)."""
        self._request("POST", "/flush_cache")

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
        return sid

    def close_session(self, session_id: str) -> None:
        """POST /close_session."""
        self._request("POST", "/close_session", json_body={"session_id": session_id})

    @contextlib.contextmanager
    def session_params(self, params: dict[str, Any]) -> Iterator[None]:
        """Send `session_params` with every generation request issued inside this block (not the scoring
        pass).  Instance-wide, not per thread: do not mix sessions in concurrent programs on one backend."""
        if not isinstance(params, dict) or "id" not in params:
            raise ValueError(f"session_params must be a dict with an 'id', got {params!r}")
        old, self.default_session_params = self.default_session_params, dict(params)
        try:
            yield
        finally:
            self.default_session_params = old

    # -- /generate --------------------------------------------------------------------------
    def _post_generate(self, items: list[_Item], *, batched: bool) -> list[dict[str, Any]]:
        """One POST /generate for one request (batched=False) or a list of them (batched=True)."""
        rids = [it[2] for it in items]
        lens = [len(it[0]) for it in items]
        url = self.base_url + "/generate"
        for ids, _, rid, _, _ in items:
            if len(ids) == 0:
                raise SGLangServerError(f"SGLang server {url}: empty prompt for rid={rid}", url=url,
                                        rids=[rid], prompt_lens=[0])
        body = _generate_body(items, batched)
        resp = self._request("POST", "/generate", json_body=body, rids=rids, prompt_lens=lens)
        try:
            data = resp.json()
        except (ValueError, json.JSONDecodeError) as e:
            raise SGLangServerError(f"SGLang server {url} returned non-JSON for {_describe(rids, lens)}: "
                                    f"{resp.text[:200]!r}", url=url, rids=rids, prompt_lens=lens) from e
        outs = data if batched else [data]
        _check_generate_response(url, data, outs, rids, lens)
        return outs

    def _send(self, items: list[_Item], *, batched: bool) -> list[dict[str, Any]]:
        if not items:
            return []
        if batched and len(items) > 1:
            if self.config.batch_mode == "batched" and all(it[3] is None for it in items) \
                    and len({it[4] for it in items}) == 1:
                return self._post_generate(items, batched=True)
            workers = min(self.config.max_concurrency, len(items))
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sglang-req") as pool:
                return [r[0] for r in pool.map(lambda it: self._post_generate([it], batched=False), items)]
        return [self._post_generate([it], batched=False)[0] for it in items]

    def generate(self, input_ids: Sequence[int], params: SamplingParams, *, rid: str | None = None,
                 priority: int = 0, session_params: dict[str, Any] | None = None) -> GenerateOutput:
        """One request (two passes when log p0 is needed).  A non-zero `priority` is sent as SGLang's
        `priority` (honoured only by a server launched with --enable-priority-scheduling)."""
        return self._generate_many([(input_ids, params)], rids=[rid], priority=priority,
                                   session_params=session_params, batched=False)[0]

    def generate_batch(self, requests_: Sequence[tuple[Sequence[int], SamplingParams]], *,
                       priority: int = 0) -> list[GenerateOutput]:
        """Several requests together: one batched /generate (or concurrent ones, see `ServerConfig.batch_mode`)."""
        return self._generate_many(requests_, rids=[None] * len(requests_), priority=priority,
                                   session_params=None, batched=True)

    def _generate_many(self, reqs: Sequence[tuple[Sequence[int], SamplingParams]], *, rids: Sequence[str | None],
                       priority: int, session_params: dict[str, Any] | None, batched: bool) -> list[GenerateOutput]:
        session = session_params if session_params is not None else self.default_session_params
        items = []
        for (ids, p), rid in zip(reqs, rids):
            if not isinstance(p, SamplingParams):
                raise TypeError(f"params must be forerun SamplingParams, got {type(p).__name__}")
            if p.logprob_temperatures:
                raise SGLangServerError(
                    f"{self.base_url}: request asks for log q at extra temperatures {p.logprob_temperatures} "
                    "(MultiTryMH's mixture proposal); a stock SGLang server returns log q only at the sampled "
                    "temperature. Run MultiTryMH on the embedded engine, or serve a plugin that returns them.",
                    url=self.base_url, rids=[rid or ""], prompt_lens=[len(ids)])
            ids_l = [int(t) for t in ids]
            items.append((ids_l, p, rid or uuid.uuid4().hex, session, priority or None))
        outs = self._send(items, batched=batched)
        # pass 2: log p0 of the generated tokens (and top-k of p0) by scoring prompt + output
        cfg = self.config
        need = [i for i, (it, out) in enumerate(zip(items, outs))
                if cfg.two_pass_logp0 and it[1].return_logprob and out["output_ids"]
                and cfg.logp0_key not in out["meta_info"] and not self._logq_is_logp0(it[1])]
        scores: dict[int, dict[str, Any]] = {}
        if need:
            score_items = []
            for i in need:
                ids, p, rid, _, _ = items[i]
                full = ids + [int(t) for t in outs[i]["output_ids"]]
                sp = SamplingParams(max_new_tokens=0, temperature=1.0, return_logprob=True,
                                    logprob_start_len=len(ids) - 1, top_logprobs_num=p.top_logprobs_num)
                score_items.append((full, sp, f"{rid}-logp0", None, priority or None))
            for i, s in zip(need, self._send(score_items, batched=True)):
                scores[i] = s
        return [self._to_output(it, out, scores.get(i)) for i, (it, out) in enumerate(zip(items, outs))]

    def _logq_is_logp0(self, p: SamplingParams) -> bool:
        return self.config.reuse_logq_at_unit_temperature and p.temperature in (0.0, 1.0)

    def _to_output(self, item: _Item, out: dict[str, Any], score: dict[str, Any] | None) -> GenerateOutput:
        ids, p, rid, _, _ = item
        meta = dict(out["meta_info"])
        output_ids = tuple(int(t) for t in out["output_ids"])
        text = out.get("text")
        if text is None:
            text = self.tokenizer.decode(list(output_ids))
        meta.setdefault("prompt_tokens", len(ids))
        meta.setdefault("completion_tokens", len(output_ids))
        meta.setdefault("cached_tokens", 0)
        logq = logp0 = entropy = input_logp0 = None
        if p.return_logprob:
            where = _Where(self.base_url + "/generate", rid, len(ids))
            otl = meta.get("output_token_logprobs")
            if otl is None or len(otl) != len(output_ids):
                raise where.error(f"returned {0 if otl is None else len(otl)} output logprobs for "
                                  f"{len(output_ids)} tokens (rid={rid})")
            logq = tuple(float(e[0]) for e in otl)
            itl = meta.get("input_token_logprobs")
            if itl is not None:
                input_logp0 = tuple(None if e[0] is None else float(e[0]) for e in itl)
            logp0 = self._output_logp0(p, meta, output_ids, logq, score, where)
            if self.config.entropy_key in meta:
                entropy = tuple(float(x) for x in meta[self.config.entropy_key])
                meta["output_token_entropy"] = list(entropy)
        return GenerateOutput(input_ids=tuple(ids), output_ids=output_ids, text=text, meta_info=meta,
                              output_logq=logq, output_logp0=logp0, output_entropy=entropy,
                              input_logp0=input_logp0, input_entropy=None)

    def _output_logp0(self, p: SamplingParams, meta: dict[str, Any], output_ids: tuple[int, ...],
                      logq: tuple[float, ...], score: dict[str, Any] | None, where: _Where) -> tuple[float, ...] | None:
        """log p0 of the generated tokens, in order of preference: the scoring pass, a plugin's key, the
        reported logprobs where they already are log p0, nothing to score; sets meta["output_token_logp0"]."""
        if score is not None:
            logp0 = _logp0_from_score(p, meta, output_ids, score["meta_info"], where)
        elif self.config.logp0_key in meta:
            logp0 = tuple(float(x) for x in meta[self.config.logp0_key])
        elif self._logq_is_logp0(p):
            logp0 = logq
        elif not output_ids:
            logp0 = ()
        else:
            return None
        meta["output_token_logp0"] = list(logp0)
        return logp0


class _Where(NamedTuple):
    """The request a response belongs to, for error messages."""

    url: str
    rid: str
    prompt_len: int

    def error(self, what: str) -> SGLangServerError:
        return SGLangServerError(f"SGLang server {self.url} {what}", url=self.url, rids=[self.rid],
                                 prompt_lens=[self.prompt_len])


def _generate_body(items: Sequence[_Item], batched: bool) -> dict[str, Any]:
    """The JSON of one /generate: per-item lists when batched, scalars otherwise."""

    def field(fn: Any) -> Any:
        vals = [fn(it) for it in items]
        return vals if batched else vals[0]

    body: dict[str, Any] = {
        "input_ids": field(lambda it: list(it[0])),
        "rid": field(lambda it: it[2]),
        "sampling_params": field(lambda it: it[1].to_srt_json()),
        "return_logprob": field(lambda it: bool(it[1].return_logprob)),
        "logprob_start_len": field(lambda it: int(it[1].logprob_start_len)),
        "top_logprobs_num": field(lambda it: int(it[1].top_logprobs_num)),
        "return_text_in_logprobs": True,
        "stream": False,
    }
    sessions = [it[3] for it in items]
    if any(s is not None for s in sessions):
        if batched:
            raise ValueError("session_params cannot be sent in a batched /generate; use batch_mode='concurrent'")
        body["session_params"] = sessions[0]
    priorities = [it[4] for it in items]
    if any(p for p in priorities):
        if batched and len(set(priorities)) > 1:
            raise ValueError("a batched /generate carries one priority; use batch_mode='concurrent'")
        body["priority"] = int(priorities[0] or 0)
    return body


def _check_generate_response(url: str, data: Any, outs: Any, rids: Sequence[str], lens: Sequence[int]) -> None:
    """Every item answered with meta_info and output_ids, none aborted; else SGLangServerError."""
    if not isinstance(outs, list) or len(outs) != len(rids) or not all(isinstance(o, dict) for o in outs):
        raise SGLangServerError(f"SGLang server {url} returned a malformed response for "
                                f"{_describe(rids, lens)}: {str(data)[:200]}", url=url, rids=rids, prompt_lens=lens)
    for out, rid, n in zip(outs, rids, lens):
        meta = out.get("meta_info")
        if not isinstance(meta, dict) or "output_ids" not in out:
            raise SGLangServerError(f"SGLang server {url} response for rid={rid} lacks meta_info/output_ids",
                                    url=url, rids=[rid], prompt_lens=[n])
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") == "abort":
            raise SGLangServerError(
                f"SGLang server {url} aborted rid={rid} (prompt length {n} tokens): {finish.get('message')}",
                url=url, rids=[rid], prompt_lens=[n], status=finish.get("status_code"))


def _logp0_from_score(p: SamplingParams, meta: dict[str, Any], output_ids: tuple[int, ...],
                      smeta: dict[str, Any], where: _Where) -> tuple[float, ...]:
    """log p0 of the output from the scoring pass's prompt logprobs (SGLang shift: entries [1:]); moves the
    top-k of p0 into meta["output_top_logprobs"] (the server's own, of q_τ, to output_top_logprobs_q)."""
    n_out = len(output_ids)
    entries = smeta.get("input_token_logprobs") or []
    if len(entries) != n_out + 1:
        raise where.error(f"scoring pass for rid={where.rid} returned {len(entries)} prompt logprobs, "
                          f"expected {n_out + 1} (logprob_start_len={where.prompt_len - 1})")
    shifted = entries[1:]  # SGLang shift: entry 0 is [None, x_{P-1}, ...]
    if [int(e[1]) for e in shifted] != list(output_ids):
        raise where.error(f"scoring pass for rid={where.rid} scored other tokens than the generated ones")
    if p.top_logprobs_num > 0 and smeta.get("input_top_logprobs") is not None:
        if "output_top_logprobs" in meta:
            meta["output_top_logprobs_q"] = meta["output_top_logprobs"]
        meta["output_top_logprobs"] = list(smeta["input_top_logprobs"][1:])
    meta["logp0_pass"] = {"cached_tokens": smeta.get("cached_tokens"),
                          "prompt_tokens": smeta.get("prompt_tokens"), "id": smeta.get("id")}
    return tuple(float(e[0]) for e in shifted)
