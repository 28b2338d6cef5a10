"""What SGLang 0.5.23's tokenizer manager checks before a /generate reaches its scheduler, for the stand-in server.

A request the tokenizer manager refuses (a ValueError: HTTP 400) never runs.  For a batch of `input_ids` it checks
EVERY item before it sends any (`tokenizer_manager._handle_batch_request`: `_should_use_batch_tokenization` is true
for a batch without text, and `_batch_tokenize_and_process` builds all the tokenized requests, each through
`_create_tokenized_object`'s `SamplingParams.normalize` / `verify`, before `_send_batch_request`), so a bad item
refuses the whole batch with nothing run.  What only the scheduler refuses (a session abort, a logprob_start_len
past the prompt) is the server's: every item of the batch was sent, the batch fails (`StandInServer._abort_a_batch`).
A batch of `text` (SGLang tokenizes and sends its items one by one, and aborts those sent when a later one is
refused) is checked whole here too.

    SGLang                                            here
    GenerateReqInput._validate_rid_uniqueness          rid_error: a rid list naming one rid twice
    input_ids: ints of the vocabulary, not empty       prompt_error
    _validate_one_request: the context                 stopping.context_error
    SamplingParams.normalize, then .verify             request_rules (stop limits), then verify_error: every check
                                                       of verify in its order, the values echoed as given
    beam_width > 1                                     a beam search request (io_struct L517-529: no fan-out for n;
                                                       the scheduler's BeamCoordinator): refused, as the stand-in
                                                       lacks it (it sampled one sequence, beam_width ignored)
    sampling_params.n                                  parallel_sample_num (GenerateReqInput._handle_parallel_
                                                       sampling): only n > 1 fans out, so a single request with
                                                       n <= 1 (0, -1 too) is one request; the server runs n > 1;
                                                       parallel_sampling_error: n < 1 in a batch is HTTP 500 (SGLang
                                                       expands it to 0 copies, then indexes them)
    repetition_penalty != 1, logit_bias                refused, as the stand-in lacks them
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from .byte_model import GREEDY_BELOW, VOCAB_SIZE, Sampling
from .routes import HTTPError
from .stopping import StopRules, context_error, request_stop_rules

PENALTIES_OFF = {"repetition_penalty": 1.0}
"""The SGLang penalty the stand-in lacks (frequency / presence it applies): another value is HTTP 400, as is a
logit_bias."""
UNSEEDED_DETERMINISTIC_SEED = 42
"""SamplingBatchInfo.from_schedule_batch: a request without sampling_seed gets 42 under deterministic inference."""


@dataclass(frozen=True)
class Admitted:
    """One request the tokenizer manager accepted: its prompt, sampling_params, and how it samples and stops."""

    ids: list[int]
    sp: dict[str, Any]
    sampling: Sampling
    rules: StopRules


def rid_error(rid: Any) -> str | None:
    """SGLang's refusal of a request whose rid list names a rid more than once (None when it does not)."""
    if not isinstance(rid, list) or len(set(map(str, rid))) == len(rid):
        return None
    counts: dict[str, int] = {}
    for r in rid:
        counts[r] = counts.get(r, 0) + 1
    return f"Duplicate request IDs detected within the request: {[r for r, c in counts.items() if c > 1]}"


def prompt_error(ids: Any) -> str | None:
    """Why `ids` is not a prompt the server runs (None when it is)."""
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        return "input_ids must be a list of ints (or a list of such lists)"
    if len(ids) == 0:
        return "The input_ids is empty."
    if any(t < 0 or t >= VOCAB_SIZE for t in ids):
        return f"input_ids contain an id outside [0, {VOCAB_SIZE})"
    return None


def missing_features(sp: dict[str, Any]) -> list[str]:
    """What a request asks for that the stand-in does not implement (never ignored silently)."""
    missing = [k for k, off in PENALTIES_OFF.items() if float(sp.get(k, off)) != off]
    if sp.get("logit_bias"):
        missing.append("logit_bias")
    beam_width = sp.get("beam_width")
    if beam_width is not None and beam_width > 1:
        missing.append(f"beam search (beam_width = {beam_width!r})")
    return missing


def parallel_sample_num(sampling_params: Any) -> int:
    """GenerateReqInput._handle_parallel_sampling: n of the sampling_params (the first item's for a batch, which
    every item must share: HTTP 400), 1 for a beam search request (n is then how many beams it returns)."""
    if sampling_params is None:
        return 1
    if isinstance(sampling_params, dict):
        n = sampling_params.get("n", 1)
    else:
        if not sampling_params or not all(isinstance(sp, dict) for sp in sampling_params):
            raise HTTPError(500, "Internal Server Error")  # SGLang indexes / calls .get on them: not a ValueError
        n = sampling_params[0].get("n", 1)
        if any(sp.get("n", 1) != n for sp in sampling_params):
            raise HTTPError(400, "The parallel_sample_num should be the same for all samples in sample params.")
    first = sampling_params if isinstance(sampling_params, dict) else sampling_params[0]
    return 1 if (first.get("beam_width") or 1) > 1 else n


def parallel_sampling_error(body: dict[str, Any], n: int) -> HTTPError | None:
    """What a batch with parallel_sample_num `n` != 1 fails with before it runs (None when nothing):
    `_normalize_logprob_params` refuses per-item logprob lists with n > 1 (HTTP 400); with n < 1 the batch expands
    to no items and `_handle_batch_request` then indexes them (an IndexError: HTTP 500)."""
    if n < 1:
        return HTTPError(500, "Internal Server Error")
    for name in ("return_logprob", "logprob_start_len", "top_logprobs_num"):
        if isinstance(body.get(name), list):
            return HTTPError(400, f"Cannot use list {name} with parallel_sample_num > 1")
    return None


def verify_error(sp: dict[str, Any]) -> str | None:
    """`SamplingParams.verify`'s message for a request's sampling_params (None when it passes), its checks in its
    order, after its __post_init__ (a temperature in [0, 1e-6) is greedy: top_k 1; top_k -1 is the whole
    vocabulary); the values as the request gives them (SGLang echoes them unconverted: "got 3", not "got 3.0")."""
    def get(name: str, default: Any) -> Any:
        return default if sp.get(name) is None else sp[name]

    beam_width, temperature, top_k = sp.get("beam_width"), get("temperature", 1.0), get("top_k", -1)
    if beam_width is not None and beam_width < 1:
        return f"beam_width must be at least 1, got {beam_width}."
    if 0 <= temperature < GREEDY_BELOW:
        top_k = 1
    top_k = 1 << 30 if top_k == -1 else top_k
    if not math.isfinite(temperature) or temperature < 0.0:
        return f"temperature must be a non-negative finite number, got {temperature}."
    for name, default, low, high, closed_low in (("top_p", 1.0, 0.0, 1.0, False), ("min_p", 0.0, 0.0, 1.0, True)):
        value = get(name, default)
        if not (low <= value if closed_low else low < value) or not value <= high:
            return f"{name} must be in {'[' if closed_low else '('}0, 1], got {value}."
    if top_k < 1:
        return f"top_k must be -1 (disable) or at least 1, got {top_k}."
    for name in ("frequency_penalty", "presence_penalty"):
        if not -2.0 <= get(name, 0.0) <= 2.0:
            return f"{name} must be in [-2, 2], got {get(name, 0.0)}."
    if not 0.0 < get("repetition_penalty", 1.0) <= 2.0:
        return f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {get('repetition_penalty', 1.0)}."
    min_new, max_new = get("min_new_tokens", 0), sp.get("max_new_tokens", 128)
    if not 0 <= min_new:
        return f"min_new_tokens must be in [0, max_new_tokens], got {min_new}."
    if max_new is not None and max_new < 0:
        return f"max_new_tokens must be at least 0, got {max_new}."
    if max_new is not None and not min_new <= max_new:
        return f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}."
    for token_id in sp.get("logit_bias") or {}:
        if not 0 <= int(token_id) < VOCAB_SIZE:
            return f"logit_bias must has keys in [0, {VOCAB_SIZE - 1}], got {token_id}."
    seed = sp.get("sampling_seed")
    if seed is not None and not isinstance(seed, int):
        return f"sampling_seed must be an integer, got {type(seed).__name__}."
    if seed is not None and not -(2**63) <= seed <= 2**63 - 1:
        return f"sampling_seed must be in [-2**63, 2**63 - 1], got {seed}."
    if sum(sp.get(f) is not None for f in ("json_schema", "regex", "ebnf", "structural_tag")) > 1:
        return "Only one of json_schema, regex, ebnf, or structural_tag can be set."
    return None


def request_sampling(sp: dict[str, Any], *, deterministic: bool, fresh_seed: Callable[[], int]) -> Sampling:
    """How a request that passed `verify_error` samples: SGLang's defaults and its seed rule - `sampling_seed`, 42
    when none under deterministic inference; `fresh_seed()` otherwise (no seed tensor: torch.multinomial); HTTP 400
    for what the stand-in does not implement."""
    temperature = float(sp.get("temperature", 1.0))
    fields = dict(
        temperature=0.0 if 0 <= temperature < GREEDY_BELOW else temperature,
        top_k=int(sp.get("top_k", -1)),
        top_p=float(sp.get("top_p", 1.0)),
        min_new_tokens=int(sp.get("min_new_tokens", 0)),
        min_p=float(sp.get("min_p", 0.0)),
        **{name: float(sp.get(name, 0.0)) for name in ("frequency_penalty", "presence_penalty")},
    )
    missing = missing_features(sp)
    if missing:
        raise HTTPError(400, f"the stand-in server does not implement {', '.join(missing)}")
    seed = sp.get("sampling_seed")
    if not deterministic:
        seed = fresh_seed()
    elif seed is None:
        seed = UNSEEDED_DETERMINISTIC_SEED
    return Sampling(seed=seed, **fields)


def request_rules(tokenizer: Any, sp: dict[str, Any]) -> StopRules:
    """When the request stops (`stopping`): SGLang's defaults, its normalize's limits (HTTP 400)."""
    try:
        return request_stop_rules(tokenizer, sp)
    except ValueError as exc:
        raise HTTPError(400, str(exc)) from None
    except re.error:  # not a ValueError: it escapes SGLang's handlers
        raise HTTPError(500, "Internal Server Error") from None


def admit(tokenizer: Any, ids: Any, sp: dict[str, Any], *, context_length: int, deterministic: bool,
          fresh_seed: Callable[[], int]) -> Admitted:
    """One request (or batch item) through the tokenizer manager's checks: Admitted, or HTTPError."""
    problem = prompt_error(ids) or context_error(len(ids), sp.get("max_new_tokens"), context_length)
    if problem:
        raise HTTPError(400, problem)
    rules = request_rules(tokenizer, sp)  # SamplingParams.normalize, then .verify (_create_tokenized_object)
    problem = verify_error(sp)
    if problem:
        raise HTTPError(400, problem)
    sampling = request_sampling(sp, deterministic=deterministic, fresh_seed=fresh_seed)
    return Admitted(list(ids), sp, sampling, rules)
