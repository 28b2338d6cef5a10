"""The meta_info the stand-in SGLang server builds beside its generation (`server`): the logprob keys of a response,
and the whole output of a request its scheduler aborts before the prefill."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from .admission import Admitted
from .byte_model import ByteModel, Generation, generate
from .detokenizer import text_after_each_send
from .routes import SchedulerAbort


def logprob_meta(m: ByteModel, ids: list[int], gen: Generation, logprob_start_len: int, top_logprobs_num: int,
                 text_of: Any) -> dict[str, Any]:
    """The logprob keys of meta_info (return_logprob): prompt entries with SGLang's shift, output entries.
    logprob_start_len -1 means none (the scheduler sets it to the prompt length; module docstring)."""
    start = len(ids) if logprob_start_len < 0 else logprob_start_len
    in_lp: list[list] = [[None, ids[start], text_of(ids[start])]] if start < len(ids) else []
    in_top: list[Any] = [None] if start < len(ids) else []
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


def aborted_before_prefill(model: ByteModel, tokenizer: Any, request: Admitted, rid: str, aborted: SchedulerAbort,
                           return_logprob: bool, top_logprobs_num: int) -> dict[str, Any]:
    """The output SGLang sends for a request its scheduler aborts before the prefill (`Req.set_finish_with_abort`:
    the prompt becomes the one token 0 "to skip the long prefill", logprobs off).  The prefill still runs and
    its token is appended before the abort finishes the request (process_batch_result_prefill), so the output
    carries one token: sampled after [0], or the dummy 0 of a prefill-only batch (max_new_tokens 0,
    tp_worker); the requested logprob lists are empty (output_streamer, convert_logprob_style)."""
    stub = [0]
    if request.rules.max_new_tokens == 0:
        out_ids = [0]
    else:
        out_ids = generate(model, stub, request.sampling, replace(request.rules, max_new_tokens=1), 0,
                           lambda t: None).ids
    finish = {"type": "abort", "message": str(aborted), "status_code": aborted.status, "err_type": aborted.err_type}
    text = text_after_each_send(tokenizer, stub, out_ids, [len(out_ids)], finish,
                                bool(request.sp.get("no_stop_trim", False)))[-1]
    meta: dict[str, Any] = {"id": rid, "finish_reason": finish, "prompt_tokens": len(stub),
                            "weight_version": "default", "num_retractions": 0}
    if return_logprob:
        meta.update(input_token_logprobs=[], output_token_logprobs=[], output_token_logprobs_length=0)
        if top_logprobs_num > 0:
            meta.update(input_top_logprobs=[], output_top_logprobs=[])
    meta.update(reasoning_tokens=0, completion_tokens=len(out_ids), cached_tokens=0, e2e_latency=0.0)
    return {"text": text, "output_ids": out_ids, "meta_info": meta}
