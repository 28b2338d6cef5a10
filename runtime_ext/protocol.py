"""Request parameters, results and the engine interface shared by every backend.

`SamplingParams` is the one request-parameter dataclass (adapters: `from_sgl` for the SGLang frontend's
`SglSamplingParams`, `to_srt_json` for the SGLang server's `/generate`).  `GenerateOutput` carries the
SGLang-shaped `meta_info` plus typed per-token arrays:

    paper                       code (GenerateOutput / meta_info key)
    log q_τ(y_t | ·)            output_logq        / meta_info["output_token_logprobs"][t][0]
    log p0(y_t | ·)             output_logp0       / meta_info["output_token_logp0"][t]
    H(p0(· | y_<t))             output_entropy     / meta_info["output_token_entropy"][t]
    log p0(x_t | x_<t) (prompt) input_logp0        / meta_info["input_token_logprobs"][i][0]

Constrained decoding (issue 32): `regex`, `json_schema` and `ebnf` are SGLang's request fields (at most one);
the embedded engine enforces them with xgrammar token bitmasks (`engine.grammar`), a server with its own grammar
backend.  A constrained token is drawn from q_τ restricted to the grammar's allowed tokens and renormalised:
`output_token_logprobs` are then of that masked distribution (as on an SGLang server) and
`meta_info["output_token_logprobs_masked"]` says so; log p0, the entropy and the top-k stay those of the raw
logits.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

GREEDY_BELOW = 1e-6
"""A temperature in [0, 1e-6) is greedy, τ = 0 (SGLang's `_SAMPLING_EPS`: it runs such a request as argmax and reports
log p0)."""
MAX_STOP_COUNT = 32
MAX_STOP_REGEX_COUNT = 32
MAX_STOP_REGEX_LEN = 256
"""SGLang 0.5.23's limits on one request: at most 32 stop strings, 32 stop_regex patterns of at most 256 UTF-8 bytes
each (srt/sampling/sampling_params.py L44-46, refused by its `normalize` with a ValueError: HTTP 400)."""
CONSTRAINT_FIELDS = ("regex", "json_schema", "ebnf")
"""SGLang's constrained-decoding fields of `sampling_params` (srt/sampling/sampling_params.py), at most one set."""


def as_integer(name: str, value: Any) -> int:
    """`value` as an int: Python and numpy integers pass, anything else (a float, a bool, a string) is refused."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return operator.index(value)


MAX_PARALLEL_SEQUENCES = 65_536
"""Most sequences one item decodes side by side (best-of-N's samples, Power-SMC's particles): each is a request,
batched at once; `--best-of 1e14` hung building them after the model had loaded."""


def check_parallel_sequences(name: str, count: int) -> None:
    """Refuse a count of side-by-side sequences under 1 or over MAX_PARALLEL_SEQUENCES."""
    if not 1 <= count <= MAX_PARALLEL_SEQUENCES:
        raise ValueError(f"{name} must be in [1, {MAX_PARALLEL_SEQUENCES}], got {count}")


def as_finite(name: str, value: Any) -> float:
    """`value` as a finite float (ints and numpy floats pass; NaN, infinities and non-numbers are refused)."""
    if isinstance(value, bool) or not hasattr(type(value), "__float__"):
        raise ValueError(f"{name} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return out


def check_inverse_alpha(alpha: float) -> None:
    """Refuse an α > 0 so small that τ = 1/α overflows to inf (a subnormal passes `alpha > 0` and failed only
    inside the first model call, after the model had loaded)."""
    if math.isinf(1.0 / alpha):
        raise ValueError(f"alpha {alpha} is too small: τ = 1/α overflows to inf")


def check_proposal_temperature(name: str, tau: float) -> None:
    """Refuse a proposal temperature whose log q_τ no engine reports: below `GREEDY_BELOW` SGLang (and, as it does,
    `SamplingParams`) runs the request greedy and reports log p0, so an MH ratio or an SMC weight built from the
    reported log q would silently use p0 in place of q_τ."""
    if 0 < tau < GREEDY_BELOW:
        raise ValueError(f"{name} = {tau:g} is below {GREEDY_BELOW:g}: SGLang runs such a temperature greedy and "
                         "reports log p0, not the log q_τ the sampler needs")


def check_stop_limits(stops: Sequence[str], patterns: Sequence[str]) -> None:
    """Refuse what SGLang's `SamplingParams.normalize` refuses, with its messages: more than MAX_STOP_COUNT stop
    strings, more than MAX_STOP_REGEX_COUNT stop_regex patterns, a pattern over MAX_STOP_REGEX_LEN UTF-8 bytes."""
    if len(stops) > MAX_STOP_COUNT:
        raise ValueError(f"at most {MAX_STOP_COUNT} stop strings are allowed, got {len(stops)}")
    if len(patterns) > MAX_STOP_REGEX_COUNT:
        raise ValueError(f"at most {MAX_STOP_REGEX_COUNT} stop_regex patterns are allowed, got {len(patterns)}")
    for pattern in patterns:
        size = len(pattern.encode("utf-8")) if isinstance(pattern, str) else 0
        if size > MAX_STOP_REGEX_LEN:
            raise ValueError(f"stop_regex is {size} bytes, over the {MAX_STOP_REGEX_LEN}-byte limit")


@dataclass(frozen=True)
class SamplingParams:
    """One request's parameters (SGLang names; `max_new_tokens=0` is prefill-only scoring)."""

    max_new_tokens: int = 128
    """Tokens to generate; 0 scores the prompt only."""
    temperature: float = 1.0
    """Temperature τ of q_τ; 0 means greedy (argmax), and so does any τ below 1e-6 (made 0, as SGLang does)."""
    top_k: int = -1
    """Keep the k most likely tokens before sampling; -1 disables (full vocabulary); unchecked when greedy."""
    top_p: float = 1.0
    """Nucleus mass; 1.0 disables."""
    min_p: float = 0.0
    """After top-k and top-p, drop the tokens whose q_τ is below min_p × the largest (SGLang's min-p); 0 disables."""
    frequency_penalty: float = 0.0
    """SGLang's frequency penalty (logits minus it × the token's count in the output); in [-2, 2].  The SGLang
    server applies it; the embedded engine refuses a non-zero value."""
    presence_penalty: float = 0.0
    """SGLang's presence penalty (logits minus it for every token already in the output); in [-2, 2].  As
    frequency_penalty: the server applies it, the embedded engine refuses a non-zero value."""
    min_new_tokens: int = 0
    """Until this many tokens are out, EOS and the stop ids are masked out of the draws (SGLang's penalizer; stop
    strings still stop)."""
    stop: tuple[str, ...] = ()
    """Stop strings, checked in list order in the output with special tokens spelled out ("<|im_end|>"), ignore_eos
    or not; the text (special tokens skipped) is cut before the first occurrence, as SGLang does."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra stop token ids: kept in output_ids, dropped from the text, ignored under ignore_eos (as EOS)."""
    stop_regex: tuple[str, ...] = ()
    """Stop patterns (SGLang `stop_regex`): the generation ends at the first token after which `re.search` finds a
    pattern in the output with special tokens spelled out; the text is cut where the pattern's source occurs
    literally, else kept whole (SGLang's detokenizer trims the matched pattern as if it were a stop string)."""
    ignore_eos: bool = False
    """Generate exactly max_new_tokens, ignoring EOS (the papers' fixed response length n)."""
    seed: int | None = None
    """SGLang `sampling_seed`: noise is keyed by (seed, absolute position); None draws a fresh seed."""
    return_logprob: bool = False
    """Return per-token log q_τ, log p0 and entropy of p0 (and prompt log p0 from logprob_start_len)."""
    logprob_start_len: int = -1
    """First prompt position whose logprob is returned (SGLang shift: entry 0 is None); -1: none."""
    top_logprobs_num: int = 0
    """Top-k of the raw distribution p0 per position (logprob, id) returned when > 0."""
    logprob_temperatures: tuple[float, ...] = ()
    """Extra temperatures τ' at which log q_τ'(y_t | ·) (full vocabulary) of every generated token is
    returned (`meta_info["output_token_logq_by_temperature"]`); MultiTryMH's mixture proposal needs them."""
    regex: str | None = None
    """Constrain the output to this regular expression (SGLang `sampling_params.regex`)."""
    json_schema: str | None = None
    """Constrain the output to JSON matching this schema, a JSON string (SGLang `sampling_params.json_schema`)."""
    ebnf: str | None = None
    """Constrain the output to this EBNF grammar, start rule `root` (SGLang `sampling_params.ebnf`)."""

    def __post_init__(self) -> None:
        # Types first: a float where an int belongs used to pass here and fail on the engine's worker thread.
        for name in ("max_new_tokens", "top_k", "min_new_tokens", "logprob_start_len", "top_logprobs_num"):
            object.__setattr__(self, name, as_integer(name, getattr(self, name)))
        if self.seed is not None:
            object.__setattr__(self, "seed", as_integer("seed", self.seed))
            if not -(2**63) <= self.seed <= 2**63 - 1:  # SGLang's verify; the engine's noise keys are 64-bit
                raise ValueError(f"seed must be in [-2**63, 2**63 - 1], got {self.seed}")
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty"):
            object.__setattr__(self, name, as_finite(name, getattr(self, name)))
        if not 0.0 <= self.min_p <= 1.0:  # SGLang's SamplingParams.verify, as the two below
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:  # SGLang's SamplingParams.verify
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens ({self.max_new_tokens})], got "
                             f"{self.min_new_tokens}")
        if self.logprob_start_len < -1:
            raise ValueError(f"logprob_start_len must be >= -1, got {self.logprob_start_len}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.temperature < GREEDY_BELOW:  # SGLang's SamplingParams.__post_init__ (_SAMPLING_EPS): greedy
            object.__setattr__(self, "temperature", 0.0)
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.temperature > 0 and (self.top_k == 0 or self.top_k < -1):  # greedy: SGLang makes top_k 1 first
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.top_logprobs_num < 0:
            raise ValueError(f"top_logprobs_num must be >= 0, got {self.top_logprobs_num}")
        object.__setattr__(self, "stop", tuple([self.stop] if isinstance(self.stop, str) else self.stop))
        if any(not isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be strings, got {self.stop!r}")
        object.__setattr__(self, "stop_token_ids", tuple(as_integer("stop_token_ids", t) for t in self.stop_token_ids))
        regexes = [self.stop_regex] if isinstance(self.stop_regex, str) else list(self.stop_regex)
        check_stop_limits(self.stop, regexes)
        object.__setattr__(self, "stop_regex", tuple(r for r in regexes if r))
        for pattern in self.stop_regex:  # SGLang refuses a bad pattern at ingress (its normalize)
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid stop_regex {pattern!r}: {exc}") from None
        object.__setattr__(self, "logprob_temperatures", tuple(float(t) for t in self.logprob_temperatures))
        if any(not (t > 0) for t in self.logprob_temperatures):
            raise ValueError(f"logprob_temperatures must be > 0, got {self.logprob_temperatures}")
        set_fields = [name for name in CONSTRAINT_FIELDS if getattr(self, name) is not None]
        if len(set_fields) > 1:  # SGLang's SamplingParams.verify refuses it too
            raise ValueError(f"at most one of regex, json_schema, ebnf may be set, got {', '.join(set_fields)}")
        for name in set_fields:
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {type(getattr(self, name)).__name__}")

    @property
    def constraint(self) -> tuple[str, str] | None:
        """(field, grammar text) of the constraint - field one of CONSTRAINT_FIELDS - or None."""
        for name in CONSTRAINT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                return name, value
        return None

    @classmethod
    def from_sgl(
        cls, p: Any, seed: int | None = None, logprob_temperatures: Sequence[float] = ()
    ) -> "SamplingParams":
        """Adapter from the frontend's `SglSamplingParams` (after `_resolve_sampling_params`, with a dtype gen's
        regex already set: `backends.token_exact.dtype_to_regex`); `seed` and `logprob_temperatures` come from the
        program's `sampling_seed` / `logprob_temperatures` markers."""
        if getattr(p, "n", 1) not in (None, 1):
            raise NotImplementedError("forerun backends support n=1 only; fork the program instead")
        stop = p.stop if p.stop else ()
        return cls(
            max_new_tokens=int(p.max_new_tokens),
            temperature=float(p.temperature),
            top_k=int(p.top_k),
            top_p=float(p.top_p),
            min_p=float(getattr(p, "min_p", 0.0) or 0.0),
            frequency_penalty=float(getattr(p, "frequency_penalty", 0.0) or 0.0),
            presence_penalty=float(getattr(p, "presence_penalty", 0.0) or 0.0),
            min_new_tokens=int(p.min_new_tokens or 0),
            stop=tuple([stop] if isinstance(stop, str) else stop),
            stop_token_ids=tuple(p.stop_token_ids or ()),
            stop_regex=getattr(p, "stop_regex", None) or (),
            ignore_eos=bool(p.ignore_eos),
            seed=seed,
            return_logprob=bool(p.return_logprob),
            logprob_start_len=-1 if p.logprob_start_len is None else int(p.logprob_start_len),
            top_logprobs_num=int(p.top_logprobs_num or 0),
            logprob_temperatures=tuple(logprob_temperatures),
            regex=getattr(p, "regex", None) or None,
            json_schema=getattr(p, "json_schema", None) or None,
            ebnf=getattr(p, "ebnf", None) or None,
        )

    def to_srt_json(self) -> dict[str, Any]:
        """Adapter to the SGLang server's `/generate` `sampling_params` object."""
        out: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_new_tokens": self.min_new_tokens,
            "ignore_eos": self.ignore_eos,
        }
        for name in ("min_p", "frequency_penalty", "presence_penalty"):
            if getattr(self, name) != 0.0:
                out[name] = getattr(self, name)
        if self.stop:
            out["stop"] = list(self.stop)
        if self.stop_token_ids:
            out["stop_token_ids"] = list(self.stop_token_ids)
        if self.stop_regex:
            out["stop_regex"] = list(self.stop_regex)
        if self.seed is not None:
            out["sampling_seed"] = self.seed
        if self.constraint is not None:
            name, value = self.constraint
            out[name] = value
        return out


@dataclass(frozen=True)
class GenerateOutput:
    """One finished request: ids, text, SGLang-shaped `meta_info`, typed per-token arrays."""

    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    text: str
    meta_info: dict[str, Any] = field(default_factory=dict)
    output_logq: tuple[float, ...] | None = None
    output_logp0: tuple[float, ...] | None = None
    output_entropy: tuple[float, ...] | None = None
    input_logp0: tuple[float | None, ...] | None = None
    input_entropy: tuple[float | None, ...] | None = None


class EngineError(RuntimeError):
    """A request failed in an engine (bad input, NaN logits, abort, unreachable server)."""


@runtime_checkable
class Engine(Protocol):
    """What every engine offers; the token-exact frontend backend sits on top of it."""

    tokenizer: Any

    def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, rid: str | None = None, priority: int = 0
    ) -> GenerateOutput:
        """Run one request to completion (thread-safe; concurrent calls share batched forwards)."""
        ...

    def generate_batch(self, requests: Sequence[tuple[Sequence[int], SamplingParams]]) -> list[GenerateOutput]:
        """Run several requests together and return their outputs in order."""
        ...

    def flush_cache(self) -> None: ...

    def server_info(self) -> dict[str, Any]: ...


# -- runtime extension: streamed rows (issue 12, streaming PreSTO) --------------------------------------
@dataclass(frozen=True)
class RowEvent:
    """Progress of one streamed request: the tokens generated so far; `output` once it finished (an aborted
    request finishes with finish_reason {"type": "abort"}), `error` when it failed.  `output_logq` (log q_τ of
    each token so far, as `output_token_logprobs`) and `output_top_logprobs` (as meta_info's) are set by engines
    that have them when the request asked for them (the embedded engine: return_logprob, top_logprobs_num); a
    frontend stream's incremental meta_info entries come from them."""

    rid: str
    output_ids: tuple[int, ...]
    finished: bool = False
    output: GenerateOutput | None = None
    error: BaseException | None = None
    output_logq: tuple[float, ...] | None = None
    output_top_logprobs: tuple[Any, ...] | None = None
    output_logp0: tuple[float, ...] | None = None
    """log p0 of each token so far (as `output_token_logp0`), with `output_logq` (the embedded engine)."""

    @property
    def aborted(self) -> bool:
        reason = (self.output.meta_info.get("finish_reason") or {}) if self.output is not None else {}
        return reason.get("type") == "abort"


RowListener = Callable[[list[RowEvent]], None]
"""Receives the events of a batch of streamed rows (the embedded engine: once per decode step)."""


@runtime_checkable
class StreamingEngine(Protocol):
    """Optional runtime extension: start a request without waiting, hear its progress token by token, and
    let a request start from a running request's tokens.

    - `submit_stream(ids, params, rid=, listener=, share_from=)`: the request runs like `generate`; the
      listener receives `RowEvent`s as tokens arrive and once at the end (finished, aborted or failed).
    - `share_from=rid` names a running request whose tokens so far begin with `ids` (up to a position p):
      the embedded engine shares that row's KV (the child's prefill is a cache hit); an SGLang server
      re-prefills the tokens the parent generated after its own prompt (c′ − c for a PreSTO child),
      unless its radix cache already holds them.  It is a hint: outputs never depend on it.
    - `abort(rid)` stops a request (queued or running); its slot is free for the next one.
    The embedded engine calls the listener on its worker thread between decode steps (a request the
    listener submits joins the next step); a server client calls it from its stream-reading thread.
    """

    def submit_stream(self, input_ids: Sequence[int], params: SamplingParams, *, rid: str,
                      listener: RowListener, share_from: str | None = None) -> None: ...

    def abort(self, rid: str) -> None: ...
