"""Suffix proposals: the one model call of the power samplers, as an `@sgl.function` program.

A batch of suffix-resampling requests is ONE program that forks one branch per request from an EMPTY root
state (SGLang 0.5.23's `fork()` reads the parent's text before syncing, so nothing is put in the root) and
writes each branch's exact ids with token markers:

    b += token_ids(prompt_ids + response[:cut]); b += sampling_seed(seed)
    b += gen("suffix", max_tokens=T - cut, temperature=τ, ignore_eos=True, return_logprob=True)

and reads ids, log q_τ, log p0 and the entropy of p0 from `b.get_meta_info("suffix")`
(`output_token_logprobs` = [log q_τ, id, text], `output_token_logp0`, `output_token_entropy`).  MultiTryMH
also writes `logprob_temperatures(𝒯)` into each branch and reads `output_token_logq_by_temperature`
(log q_τ'(y_t | ·) over the full vocabulary, one row per τ' ∈ 𝒯) from the same meta_info.  Only stock
frontend calls and the markers are used, so the program runs unchanged on every token-exact backend
(embedded engine, SGLang server).  The sequential samplers use the same program with one branch; the block
extension x_{L+1:T} ~ q_τ is one such call as well.

    paper                         code
    (x_{0:c}, τ, noise) request   SuffixRequest(prefix_ids, max_tokens, temperature, seed)
    y_{c+1:T}, log q_τ, log p0, H Suffix(ids, logq, logp0, entropy)
    log q_τ' for τ' ∈ 𝒯 (MTM)     Suffix.logq_by_temp[i, t]  (meta_info output_token_logq_by_temperature)
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import time
import warnings
from typing import Any, Sequence

from ..runtime_ext.protocol import EngineError
from ..runtime_ext.backends.sglang_frontend import function, gen
from ..runtime_ext.backends.token_markers import logprob_temperatures, sampling_seed, token_ids
from .stream_proposals import open_streams
from .suffixes import Suffix, SuffixRequest, suffix_from_meta


_NONCES = itertools.count(1)


@function
def suffix_proposals(s, requests):
    """Fork one branch per request from an empty root; each branch is token-exact and seeded."""
    branches = s.fork(len(requests))
    for branch, req in zip(branches, requests):
        # A unique seed marker first (the last seed marker wins): no two requests share their program text,
        # so a backend that remembers generated text by program text can never substitute an earlier
        # request's ids (which would happen for a repeated request whose output decoded to "").
        branch += sampling_seed(req["nonce"])
        branch += token_ids(req["prefix_ids"])
        branch += sampling_seed(req["seed"])
        if req["logprob_temperatures"]:
            branch += logprob_temperatures(req["logprob_temperatures"])
        branch += gen(
            "suffix",
            max_tokens=req["max_tokens"],
            temperature=req["temperature"],
            top_k=-1,
            top_p=1.0,
            ignore_eos=True,
            return_logprob=True,
        )
    out = [(branch.get_meta_info("suffix"), branch.error()) for branch in branches]
    branches.join()
    return out


class ProgramProposalModel:
    """`ProposalModel` that runs `suffix_proposals` on an SGLang frontend backend (one program per call).

    `tempered_temperatures` 𝒯 (MultiTryMH): every branch carries a `logprob_temperatures(𝒯)` marker and the
    engine returns log q_τ'(y_t | ·) over the full vocabulary for each τ' ∈ 𝒯 (embedded engine, or an SGLang
    server with forerun's plugin; a stock server refuses such requests with a clear error).  `require_entropy` (default False; EntropyCut callers
    pass True): a backend that does not report the entropy of p0 is then an error; otherwise the entropy is
    NaN (PowerMH and MultiTryMH do not use it), so PowerMH runs on a stock SGLang server.
    """

    def __init__(self, backend: Any, *, tempered_temperatures: Sequence[float] = (),
                 require_entropy: bool = False) -> None:
        self.backend = backend
        self.tempered_temperatures = tuple(float(t) for t in tempered_temperatures)
        if any(not t > 0 for t in self.tempered_temperatures):
            raise ValueError(f"tempered_temperatures must be > 0, got {self.tempered_temperatures}")
        self.require_entropy = bool(require_entropy)
        self.last_wall_time = math.nan

    def streams(self) -> Any:
        """The rows of streaming PreSTO on this backend's engine (`stream_proposals.EngineStreams`)."""
        return open_streams(self.backend, tempered_temperatures=self.tempered_temperatures,
                            require_entropy=self.require_entropy)

    def generate(self, requests: Sequence[SuffixRequest]) -> list[Suffix]:
        if not requests:
            raise ValueError("a model call needs at least one request")
        args = [
            {"prefix_ids": list(r.prefix_ids), "max_tokens": r.max_tokens, "temperature": r.temperature,
             "seed": r.seed, "logprob_temperatures": list(self.tempered_temperatures), "nonce": next(_NONCES)}
            for r in requests
        ]
        start = time.perf_counter()
        with warnings.catch_warnings():
            # SGLang's interpreter warns with a traceback when a branch fails; the error is re-raised below
            warnings.filterwarnings("ignore", message="Error in stream_executor")
            state = suffix_proposals.run(requests=args, backend=without_template_stops(self.backend))
        results = state.ret_value
        self.last_wall_time = time.perf_counter() - start
        errors = [e for _, e in results if e is not None] + ([state.error()] if state.error() is not None else [])
        if errors:
            err = errors[0]
            if isinstance(err, EngineError):
                raise err
            raise EngineError(f"suffix proposal program failed: {err!r}")
        return [suffix_from_meta(m, r, self.tempered_temperatures, self.require_entropy)
                for (m, _), r in zip(results, requests)]


def without_template_stops(backend: Any) -> Any:
    """`backend` for a program that uses no chat roles and needs fixed-length gens: a shallow copy whose chat
    template has no stop strings.  SGLang's interpreter adds the backend's chat-template stop strings to every gen
    (`_resolve_sampling_params`), and an SGLang server matches them in output decoded with special tokens spelled
    out, ignore_eos or not: with an instruct model's template ("<|im_end|>", "<|eot_id|>", "</s>") its end-of-turn
    token ended a suffix early.  A backend whose template has none is returned as it is."""
    template = getattr(backend, "chat_template", None)
    if not getattr(template, "stop_str", None):
        return backend
    view = copy.copy(backend)
    view.chat_template = dataclasses.replace(template, stop_str=())
    return view


def proposal_model_for(backend: Any, kind: str, temperatures: Sequence[float] = ()) -> ProgramProposalModel:
    """The suffix-proposal model a sampler needs: MultiTryMH asks for log q at its temperatures 𝒯; only
    EntropyCut requires the per-token entropy of p0 (a stock SGLang server does not report it)."""
    return ProgramProposalModel(backend, tempered_temperatures=temperatures if kind == "multitry-mh" else (),
                                require_entropy=kind == "entropy-cut")
