"""SGLang 0.5.23's own stop and detokenizer code, compiled from the installed wheel's source and run on plain
objects: the oracle the stand-in's `stopping` and `detokenizer` are compared against (the runtime itself cannot
be imported here; see tests/runtime_ext/backends/sglang_source.py).

`reference_run` feeds a request's tokens one at a time to SGLang's `Req.update_finish_state`, sends output
when SGLang's output streamer would (its rule is a few lines of `SchedulerOutputStreamer.accept`, written
out here and pinned by `PINNED`), and runs each send through SGLang's `DetokenizerManager.
_decode_batch_token_id_output`; the response text is the sends' concatenation, as the tokenizer manager
makes it.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import logging
import re
import typing
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

from forerun.runtime_ext.backends import sglang_frontend  # noqa: F401  (registers the no-triton stub first)
from forerun.testing.test_modules import sibling

src = sibling(str(Path(__file__).parents[1] / "backends" / "sglang_source.py"), "sglang_source")

BATCH = "srt/managers/schedule_batch.py"
DETOKENIZER = "srt/managers/detokenizer_manager.py"
STREAMER = "srt/managers/scheduler_components/output_streamer.py"

PINNED = {
    # the output streamer's rule, written out in `reference_run` (file, line, the line's text)
    "a finished request always sends": (STREAMER, 451, "req.finished_len = len(req.output_ids)"),
    "a stream sends every step at the default interval of 1": (STREAMER, 466, "stream_interval == 1"),
    "... unless the tail ends with the start of a stop string": (
        STREAMER, 473, "should_output &= not req.check_match_stop_str_prefix()"),
    "a request that does not stream sends every 50 tokens": (
        STREAMER, 476, "len(req.output_ids) % self.default_force_stream_interval == 0"),
    "the forced interval is 50": ("srt/environ.py", 688, "SGLANG_FORCE_STREAM_INTERVAL = EnvInt(50)"),
    "the stream interval defaults to 1": ("srt/arg_groups/fields/serving.py", 265, "] = 1"),
    "a send carries the decode ids past the last send": (
        STREAMER, 514, "self.decode_ids_list.append(decode_ids[req.send_decode_id_offset :])"),
    "a streamed chunk's deferred text is the text so far": ("srt/managers/tokenizer_manager.py", 2014,
                                                            'out["text"] = state.get_text()'),
    # what the scheduler's decoded_text is: never assigned after Req.__init__, so `stop in decoded_text` only
    # holds for an empty stop string
    "the scheduler's decoded_text stays empty": (BATCH, 1206, 'self.decoded_text = ""'),
}

REQ_METHODS = ("_stop_match_tail_len", "tail_str", "check_match_stop_str_prefix", "_check_token_based_finish",
               "_locate_str_stop_finished_len", "_check_str_based_finish", "_check_vocab_boundary_finish",
               "_cap_finished_len_at_max_new_tokens", "update_finish_state", "finished",
               "init_incremental_detokenize")
DETOKENIZER_METHODS = ("trim_matched_stop", "_grouped_batch_decode", "_decode_batch_token_id_output")
FINISH_CLASSES = ("BaseFinishReason", "FINISH_MATCHED_TOKEN", "FINISH_MATCHED_STR", "FINISHED_MATCHED_REGEX",
                  "FINISH_LENGTH", "FINISH_ABORT")


def _namespace() -> dict[str, Any]:
    from sglang.utils import find_printable_text

    ns: dict[str, Any] = {"re": re, "logger": logging.getLogger("sglang-reference"), "HTTPStatus": HTTPStatus,
                          "dataclasses": dataclasses, "INIT_INCREMENTAL_DETOKENIZATION_OFFSET": 5,
                          "find_printable_text": find_printable_text, "defaultdict": collections.defaultdict,
                          **{k: getattr(typing, k) for k in ("Any", "Dict", "List", "Optional", "Tuple", "Union")}}
    for name in FINISH_CLASSES:
        ns[name] = src.compile_class(BATCH, name, ns)
    ns["DecodeStatus"] = src.compile_class(DETOKENIZER, "DecodeStatus", ns)  # its @dataclasses.dataclass runs
    return ns


def _req_class(ns: dict[str, Any]) -> type:
    body = {name: src.compile_function(src.method_def(BATCH, "Req", name), ns, BATCH) for name in REQ_METHODS}
    body["output_ids_through_stop"] = property(
        src.compile_function(src.method_def(BATCH, "Req", "output_ids_through_stop"), ns, BATCH))
    return type("Req", (), body)


def _detokenizer_class(ns: dict[str, Any]) -> type:
    body: dict[str, Any] = {name: src.compile_function(src.method_def(DETOKENIZER, "DetokenizerManager", name),
                                                       ns, DETOKENIZER) for name in DETOKENIZER_METHODS}
    body["_clamp_decode_ids"] = staticmethod(
        src.compile_function(src.method_def(DETOKENIZER, "DetokenizerManager", "_clamp_decode_ids"), ns, DETOKENIZER))
    return type("DetokenizerManager", (), body)


_NS = _namespace()
Req = _req_class(_NS)
DetokenizerManager = _detokenizer_class(_NS)


@dataclass
class ReferenceResult:
    finish_reason: dict[str, Any]
    output_ids: list[int]
    """The output ids the response carries (through the stop)."""
    sends: list[tuple[int, str]]
    """(output tokens sent so far, response text so far) at each send; the last is the response."""

    @property
    def text(self) -> str:
        return self.sends[-1][1]


def srt_sampling_params(sampling_params: dict[str, Any], tokenizer: Any) -> Any:
    """SGLang's SamplingParams as the tokenizer manager builds it (sampling_params.py imports on CPU)."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    p = SamplingParams(**copy.deepcopy(sampling_params))
    p.normalize(tokenizer)
    return p


def reference_run(tokenizer: Any, eos_token_id: int, vocab_size: int, prompt: Sequence[int],
                  tokens: Sequence[int], sampling_params: dict[str, Any], stream: bool) -> ReferenceResult:
    """What SGLang returns for a request on `prompt` whose sampler draws `tokens` one by one (the request must
    finish within them: pass at least max_new_tokens, or tokens that stop it)."""
    tok = copy.copy(tokenizer)
    tok.additional_stop_token_ids = None  # SGLang's get_tokenizer sets it; the stand-in's tokenizer has none
    req = Req()
    req.__dict__.update(
        rid="r", sampling_params=srt_sampling_params(sampling_params, tok), tokenizer=tok,
        eos_token_ids={eos_token_id}, vocab_size=vocab_size, origin_input_ids_unpadded=list(prompt),
        output_ids=[], finished_reason=None, finished_len=None, to_finish=None, decoded_text="", grammar=None,
        surr_offset=None, read_offset=None)
    detok = DetokenizerManager()
    detok.__dict__.update(decode_status={}, tokenizer=tokenizer, vocab_size=vocab_size,
                          disable_tokenizer_batch_decode=False, is_tool_call_parser_gpt_oss=False,
                          tool_close_token_ids=set())
    sends: list[tuple[int, str]] = []
    text, sent_decode_ids = "", 0
    if req.sampling_params.max_new_tokens == 0:  # prefill-only: a dummy token, then the length finish
        tokens = [0]
    for token in tokens:
        req.output_ids.append(int(token))
        req.update_finish_state()
        if req.finished():
            send = True
        elif stream:
            send = not req.check_match_stop_str_prefix()
        else:
            send = len(req.output_ids) % 50 == 0
        if send:
            decode_ids, read_offset = req.init_incremental_detokenize()
            finish = req.finished_reason.to_json() if req.finished() else None
            recv = SimpleNamespace(
                rids=["r"], decoded_texts=[req.decoded_text], decode_ids=[decode_ids[sent_decode_ids:]],
                read_offsets=[read_offset], finished_reasons=[finish],
                no_stop_trim=[req.sampling_params.no_stop_trim],
                skip_special_tokens=[req.sampling_params.skip_special_tokens],
                spaces_between_special_tokens=[req.sampling_params.spaces_between_special_tokens])
            sent_decode_ids = len(decode_ids)
            text += detok._decode_batch_token_id_output(recv)[0]
            sends.append((len(req.output_ids_through_stop), text))
        if req.finished():
            return ReferenceResult(req.finished_reason.to_json(), list(req.output_ids_through_stop), sends)
    raise ValueError(f"the request did not finish within {len(tokens)} tokens")
