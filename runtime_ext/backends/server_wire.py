"""What goes over the wire to a launched SGLang 0.5.23 server and how its answers are read.

`SGLangServerClient` (HTTP, retries, the two passes) builds every `/generate` body here and reads every
response here, so the request/response contract lives in one module (`tests/runtime_ext/backends/
test_server_contract.py` validates both against SGLang's own models).

    SGLang source (site-packages/sglang/...)                   checked here
    srt/managers/io_struct.py GenerateReqInput, api/v1/...     `generate_body`: input_ids, never text
    srt/sampling/sampling_params.py SamplingParams.verify      forerun's SamplingParams: sampling_seed in int64
    srt/layers/sampler.py Sampler._sample_from_probs           `check_request`: top-k/top-p with a seed on
                                                               the flashinfer / intel_xpu sampling backend
                                                               (the seed tensor exists only under
                                                               --enable-deterministic-inference, which 0.5.23
                                                               resolves to the pytorch backend,
                                                               arg_groups/overrides.py; the check guards a
                                                               server whose info says otherwise)
    orjson (the server's JSON encoder) writes NaN as null      `finite_logprobs`: null or NaN -> error
    ... and -inf as null (a masked top-k entry)                `top_logprobs_read`: null -> -inf there
    srt/sampling/sampling_params.py CustomParamValue           `plugin_params`: flat custom_params keys
    srt/managers/tokenizer_manager.py SessionParams(**params)  `check_session`: only SessionParams' keys
    srt/session/session_controller.py Session.create_req       `check_session`: replace=True without rid is
                                                               refused (L245-246 delete from the dict they
                                                               iterate: RuntimeError in the scheduler, which
                                                               then SIGQUITs the server, scheduler.py L6373)
    srt/sampling/sampling_batch_info.py from_schedule_batch    `fresh_seed`: under deterministic inference an
                                                               unseeded request samples with seed 42 (L163),
                                                               so the client sends a fresh random seed

`tests/runtime_ext/backends/test_server_contract.py` pins each of these lines of SGLang's source.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import requests

from ..protocol import EngineError, SamplingParams

SEED_ASSERTING_BACKENDS = ("flashinfer", "intel_xpu")
"""Sampling backends whose top-k/top-p/min-p path asserts `sampling_seed is None` (sampler.py)."""

PLUGIN_SWITCH = "forerun_plugin"
"""custom_params key that switches the forerun sampler plugin on for one request (value: true)."""
PLUGIN_TEMPERATURES = "forerun_logq_temperatures"
"""custom_params key: the extra temperatures τ' whose log q_τ' the plugin returns (a list of floats)."""
PLUGIN_INFO_KEY = "forerun_plugin"
"""/server_info key the plugin adds (its version and the meta_info keys it fills)."""
SESSION_KEYS = ("id", "rid", "offset", "replace", "drop_previous_output")
"""The fields of SGLang's `SessionParams` (srt/managers/io_struct.py): the server builds
`SessionParams(**session_params)`, so any other key fails the request."""
LOGP0_KEY = "output_token_logp0"
ENTROPY_KEY = "output_token_entropy"
LOGQ_BY_TEMPERATURE_KEY = "output_token_logq_by_temperature"


class SGLangServerError(EngineError):
    """A request to the SGLang server failed (unreachable, timeout, HTTP error, aborted, bad output)."""

    def __init__(self, message: str, *, url: str, rids: Sequence[str] = (), prompt_lens: Sequence[int] = (),
                 status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.url = url
        self.rids = tuple(rids)
        self.prompt_lens = tuple(prompt_lens)
        self.status = status
        self.attempts = attempts


@dataclass(frozen=True)
class ServerCapabilities:
    """What the server's /server_info says about the features forerun relies on."""

    deterministic: bool
    """`--enable-deterministic-inference`: only then is `sampling_seed` used (SamplingBatchInfo)."""
    sampling_backend: str | None
    """`sampling_backend` (deterministic inference forces "pytorch"; overrides.py)."""
    plugin: dict[str, Any] | None
    """The forerun sampler plugin's /server_info entry, None without the plugin."""
    priority_scheduling: bool = False
    """`--enable-priority-scheduling`: a request without a priority then ranks below every one with a priority."""
    low_priority_values_first: bool = False
    """`--schedule-low-priority-values-first`: the scheduler runs lower priority values first."""
    model_path: str | None = None
    """`model_path`: `RuntimeEndpoint` picks the programs' chat template by it."""

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> "ServerCapabilities":
        plugin = info.get(PLUGIN_INFO_KEY)
        return cls(deterministic=bool(info.get("enable_deterministic_inference")),
                   sampling_backend=info.get("sampling_backend"),
                   plugin=plugin if isinstance(plugin, dict) else None,
                   priority_scheduling=bool(info.get("enable_priority_scheduling")),
                   low_priority_values_first=bool(info.get("schedule_low_priority_values_first")),
                   model_path=info.get("model_path") or None)


def wire_priority(priority: int, caps: ServerCapabilities) -> int | None:
    """The `priority` to send for forerun's `priority` (higher runs first; background work is < 0).

    Under priority scheduling every request carries one: SGLang gives a request without a priority the last rank
    (-2**63, or 2**63 - 1 with low values first; scheduler._set_or_validate_priority), which would put normal
    requests behind the background pre-positions.  With low values first the sign is flipped.  Without it none is
    sent: the server would ignore it, or, launched with --abort-on-priority-when-disabled, abort the request."""
    if not caps.priority_scheduling:
        return None
    return -int(priority) if caps.low_priority_values_first else int(priority)


class WireRequest(NamedTuple):
    """One request as sent: exact ids, parameters, rid, session, priority, plugin switch."""

    ids: list[int]
    params: SamplingParams
    rid: str
    session: dict[str, Any] | None
    priority: int | None
    plugin: bool = False


class Where(NamedTuple):
    """The request a response belongs to, for error messages."""

    url: str
    rid: str
    prompt_len: int

    def error(self, what: str) -> SGLangServerError:
        return SGLangServerError(f"SGLang server {self.url} {what}", url=self.url, rids=[self.rid],
                                 prompt_lens=[self.prompt_len])


def describe(rids: Sequence[str], lens: Sequence[int]) -> str:
    if len(rids) == 1:
        return f"rid={rids[0]}, prompt length {lens[0]} tokens"
    shown = ", ".join(f"{r} ({n} tokens)" for r, n in list(zip(rids, lens))[:4])
    more = f", ... {len(rids) - 4} more" if len(rids) > 4 else ""
    return f"batch of {len(rids)} requests: {shown}{more}"


def error_text(resp: requests.Response) -> str:
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


# -- requests -----------------------------------------------------------------------------------
def check_request(url: str, rid: str, p: SamplingParams, caps: ServerCapabilities) -> None:
    """Reject, before sending, what the real server would reject or crash on (see the module docstring)."""
    where = f"SGLang server {url}: rid={rid}"
    filtered = p.top_k != -1 or p.top_p < 1.0 or p.min_p > 0 or p.temperature == 0  # τ = 0: top_k = 1 there
    if (p.seed is not None and filtered and caps.deterministic
            and (caps.sampling_backend or "") in SEED_ASSERTING_BACKENDS):
        raise ValueError(f"{where}: top-k/top-p/min-p together with sampling_seed is not supported by the server's "
                         f"{caps.sampling_backend} sampling backend (Sampler asserts sampling_seed is None there); "
                         "drop top-k/top-p/min-p, or relaunch with --sampling-backend pytorch")


def check_session(url: str, rid: str | None, session: Any) -> None:
    """Reject, before sending, session_params the real server crashes on or refuses (see the module docstring).

    `replace=True` without `rid` would clear the whole request tree, but 0.5.23's `Session.create_req` deletes
    the nodes from the dict it is iterating: the scheduler raises "dictionary changed size during iteration"
    and the server goes down with every request in flight.  Branch from a named request (`rid`) instead, or
    open a new session to start over."""
    if session is None:
        return
    where = f"SGLang server {url}" + (f": rid={rid}" if rid is not None else "")
    if not isinstance(session, dict) or session.get("id") is None:
        raise ValueError(f"{where}: session_params must be a dict with an 'id', got {session!r}")
    unknown = sorted(set(session) - set(SESSION_KEYS))
    if unknown:
        raise ValueError(f"{where}: session_params has keys {unknown} that SGLang's SessionParams does not define "
                         f"(allowed: {', '.join(SESSION_KEYS)})")
    if session.get("replace") and session.get("rid") is None:
        raise ValueError(
            f"{where}: session_params replace=True without rid is refused: SGLang 0.5.23 crashes on it (its session "
            "controller deletes nodes from the dict it iterates, srt/session/session_controller.py:245, and the "
            "scheduler's RuntimeError takes the server down); pass rid=<the request to branch from>, or open a new "
            "session to start over")


def fresh_seed() -> int:
    """A random sampling_seed in [0, 2**63) for a request that has none (from the OS, never a shared RNG)."""
    return secrets.randbits(63)


def penalized_logits(p: SamplingParams) -> list[str]:
    """The settings under which SGLang's penalizers change the logits its sampler reports (and the plugin reads):
    min_new_tokens (masks EOS and the stop ids), frequency / presence_penalty (subtract from output tokens)."""
    return [name for name in ("min_new_tokens", "frequency_penalty", "presence_penalty") if getattr(p, name) != 0]


def plugin_params(p: SamplingParams) -> dict[str, Any]:
    """The custom_params that switch the plugin on (flat keys: SGLang's CustomParamValue allows a scalar or a
    list of scalars per key, not nested objects)."""
    out: dict[str, Any] = {PLUGIN_SWITCH: True}
    if p.logprob_temperatures:
        out[PLUGIN_TEMPERATURES] = [float(t) for t in p.logprob_temperatures]
    return out


def _sampling_json(it: WireRequest) -> dict[str, Any]:
    sp = it.params.to_srt_json()
    if it.plugin:
        sp["custom_params"] = plugin_params(it.params)
    return sp


def generate_body(items: Sequence[WireRequest], batched: bool) -> dict[str, Any]:
    """The JSON of one /generate: per-item lists when batched, scalars otherwise."""

    def field(fn: Any) -> Any:
        vals = [fn(it) for it in items]
        return vals if batched else vals[0]

    body: dict[str, Any] = {
        "input_ids": field(lambda it: list(it.ids)),
        "rid": field(lambda it: it.rid),
        "sampling_params": field(_sampling_json),
        "return_logprob": field(lambda it: bool(it.params.return_logprob)),
        "logprob_start_len": field(lambda it: int(it.params.logprob_start_len)),
        "top_logprobs_num": field(lambda it: int(it.params.top_logprobs_num)),
        "return_text_in_logprobs": True,
        "stream": False,
    }
    sessions = [it.session for it in items]
    if any(s is not None for s in sessions):
        if batched:
            raise ValueError("session_params cannot be sent in a batched /generate; use batch_mode='concurrent'")
        body["session_params"] = sessions[0]
    priorities = [it.priority for it in items]
    if any(p is not None for p in priorities):
        if batched and len(set(priorities)) > 1:
            raise ValueError("a batched /generate carries one priority; use batch_mode='concurrent'")
        body["priority"] = int(priorities[0] or 0)
    return body


# -- responses ----------------------------------------------------------------------------------
def check_generate_response(url: str, data: Any, outs: Any, rids: Sequence[str], lens: Sequence[int]) -> None:
    """Every item answered with meta_info and output_ids, none aborted; else SGLangServerError."""
    if not isinstance(outs, list) or len(outs) != len(rids) or not all(isinstance(o, dict) for o in outs):
        raise SGLangServerError(f"SGLang server {url} returned a malformed response for "
                                f"{describe(rids, lens)}: {str(data)[:200]}", url=url, rids=rids, prompt_lens=lens)
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


def finite_logprobs(values: Sequence[Any], what: str, where: Where) -> tuple[float, ...]:
    """`values` as floats; a null (orjson writes NaN as null) or a non-finite value is an error naming the
    request and the first bad position."""
    out = []
    for t, v in enumerate(values):
        x = math.nan if v is None else float(v)
        if not math.isfinite(x) and x != -math.inf:
            raise where.error(f"returned {'null' if v is None else v} as {what} at generated token {t} for "
                              f"rid={where.rid} (prompt length {where.prompt_len} tokens): the model produced NaN")
        out.append(x)
    return tuple(out)


def top_logprobs_read(per_token: Any) -> Any:
    """SGLang's `*_top_logprobs` ([position][rank] = [logprob, id, text]) with orjson's null read back as -inf: a
    top-k entry is null on the wire only for a token of probability 0 (a grammar's or top-k / top-p's mask) - a
    NaN there comes with a NaN logprob of the token itself, which `finite_logprobs` refuses.  The embedded engine
    reports those entries as -inf."""
    if not isinstance(per_token, list):
        return per_token
    return [[[-math.inf if e[0] is None else e[0], *e[1:]] for e in pos] if isinstance(pos, list) else pos
            for pos in per_token]


def logp0_from_score(p: SamplingParams, meta: dict[str, Any], output_ids: tuple[int, ...],
                     smeta: dict[str, Any], where: Where) -> tuple[float, ...]:
    """log p0 of the output from the scoring pass's prompt logprobs (SGLang shift: entries [1:]); moves the
    top-k of p0 into meta["output_top_logprobs"] (the server's own, of q_τ, to output_top_logprobs_q)."""
    n_out = len(output_ids)
    entries = smeta.get("input_token_logprobs") or []
    if len(entries) != n_out + 1:
        raise where.error(f"scoring pass for rid={where.rid} returned {len(entries)} prompt logprobs, "
                          f"expected {n_out + 1}")
    shifted = entries[1:]  # SGLang shift: entry 0 is [None, x_{P-1}, ...]
    if [int(e[1]) for e in shifted] != list(output_ids):
        raise where.error(f"scoring pass for rid={where.rid} scored other tokens than the generated ones")
    if p.top_logprobs_num > 0 and smeta.get("input_top_logprobs") is not None:
        if "output_top_logprobs" in meta:
            meta["output_top_logprobs_q"] = meta["output_top_logprobs"]
        meta["output_top_logprobs"] = top_logprobs_read(list(smeta["input_top_logprobs"][1:]))
    meta["logp0_pass"] = {"cached_tokens": smeta.get("cached_tokens"),
                          "prompt_tokens": smeta.get("prompt_tokens"), "id": smeta.get("id")}
    return finite_logprobs([e[0] for e in shifted], "log p0 (scoring pass)", where)


def plugin_fields(p: SamplingParams, meta: dict[str, Any], n_out: int, where: Where
                  ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """log p0 and entropy of p0 per generated token from the plugin's meta_info keys; with logprob
    temperatures, meta["output_token_logq_by_temperature"] becomes (|𝒯|, n_out) rows (the plugin reports one
    row of |𝒯| values per token)."""
    for key in (LOGP0_KEY, ENTROPY_KEY) + ((LOGQ_BY_TEMPERATURE_KEY,) if p.logprob_temperatures else ()):
        if not isinstance(meta.get(key), list) or len(meta[key]) != n_out:
            got = meta.get(key)
            raise where.error(f"plugin field {key} for rid={where.rid} has "
                              f"{len(got) if isinstance(got, list) else got!r} entries for {n_out} tokens "
                              "(was the server launched with scripts/launch_runtime --plugin?)")
    logp0 = finite_logprobs(meta[LOGP0_KEY], "log p0 (plugin)", where)
    entropy = finite_logprobs(meta[ENTROPY_KEY], "entropy of p0 (plugin)", where)
    if p.logprob_temperatures:
        k = len(p.logprob_temperatures)
        rows = meta[LOGQ_BY_TEMPERATURE_KEY]
        if any(not isinstance(r, list) or len(r) != k for r in rows):
            raise where.error(f"plugin field {LOGQ_BY_TEMPERATURE_KEY} for rid={where.rid} does not hold {k} "
                              "values per token")
        cols = [finite_logprobs([r[j] for r in rows], f"log q at τ'={p.logprob_temperatures[j]:g} (plugin)", where)
                for j in range(k)]
        meta[LOGQ_BY_TEMPERATURE_KEY] = [list(c) for c in cols]
        meta["logprob_temperatures"] = list(p.logprob_temperatures)
    return logp0, entropy
