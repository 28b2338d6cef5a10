"""A token-exact SGLang frontend backend on top of any `Engine`-like `run(ids, params)` callable.

Stock `RuntimeEndpoint` sends `s.text_` and lets the server re-tokenize it; forerun backends send ids:

* `token_ids(...)` markers in the program text are decoded to exactly those ids
  (see `token_markers`), `sampling_seed(...)` markers set the request seed;
* text this backend generated earlier is remembered with its ids (a bounded LRU keyed by the full
  program text after the generation), so a later request whose text extends it reuses those ids
  exactly - this is what keeps forks and multi-gen programs exact without markers;
* any other text is tokenized.

Subclasses implement `run(input_ids, params) -> GenerateOutput` and `tokenizer`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from ..protocol import GenerateOutput, SamplingParams
from .sglang_frontend import (
    BaseBackend,
    ChoicesDecision,
    SglSamplingParams,
    StreamExecutor,
    token_length_normalized,
)
from .token_markers import Directives, IdsSegment, parse_marked_text, parse_marked_text_directives


class TokenExactBackend(BaseBackend):
    """SGLang frontend backend whose requests are token ids, never re-tokenized text."""

    def __init__(self, tokenizer: Any, *, memory_size: int = 4096, add_special_tokens: bool = True) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.memory_size = memory_size
        self.add_special_tokens = add_special_tokens
        self._memory: "OrderedDict[str, tuple[int, ...]]" = OrderedDict()
        self._memory_lock = threading.Lock()

    # -- to implement -------------------------------------------------------------------------
    def run(self, input_ids: Sequence[int], params: SamplingParams) -> GenerateOutput:
        raise NotImplementedError

    def run_batch(self, requests: Sequence[tuple[Sequence[int], SamplingParams]]) -> list[GenerateOutput]:
        """Default: one `run` per request; engines override to share one batched call."""
        return [self.run(ids, p) for ids, p in requests]

    # -- text -> ids --------------------------------------------------------------------------
    def _tokenize(self, text: str, at_start: bool) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens and at_start))

    def _remember(self, text: str, ids: Sequence[int]) -> None:
        with self._memory_lock:
            self._memory[text] = tuple(ids)
            self._memory.move_to_end(text)
            while len(self._memory) > self.memory_size:
                self._memory.popitem(last=False)

    def _decode(self, ids: Sequence[int]) -> str | None:
        """The literal text of `ids` (special tokens included); None if the tokenizer cannot decode."""
        decode = getattr(self.tokenizer, "decode", None)
        if decode is None:
            return None
        try:
            return decode(list(ids), skip_special_tokens=False)
        except TypeError:  # minimal tokenizers without the keyword
            return decode(list(ids))

    def _remember_generation(self, text_before: str, ids_before: Sequence[int], out: GenerateOutput) -> None:
        """Remember `text_before + out.text` as `ids_before + the output ids that spell exactly out.text`.

        The output ids can spell more than `out.text` (a stop string cuts the text but keeps the token that
        completed it; EOS is skipped in the text), and an empty text would re-key `text_before` itself.  Only
        a prefix of the output ids whose decoding is exactly `out.text` is remembered; if none is, nothing is,
        and later requests tokenize that text instead (correct, merely not id-exact).
        """
        if not out.text:
            return
        n = len(out.output_ids)
        for k in range(n, max(n - 8, 0), -1):
            if self._decode(out.output_ids[:k]) == out.text:
                self._remember(text_before + out.text, list(ids_before) + list(out.output_ids[:k]))
                return

    def _longest_remembered(self, text: str) -> tuple[str, tuple[int, ...]]:
        best = ""
        ids: tuple[int, ...] = ()
        with self._memory_lock:
            for key, val in self._memory.items():
                if len(key) > len(best) and text.startswith(key):
                    best, ids = key, val
            if best:
                self._memory.move_to_end(best)
        return best, ids

    def input_ids_of(self, text: str) -> tuple[list[int], int | None]:
        """Exact ids of a program text, and the sampling seed its markers set (None if none)."""
        ids, directives = self.request_of(text)
        return ids, directives.seed

    def request_of(self, text: str) -> tuple[list[int], Directives]:
        """Exact ids of a program text, and the request settings its markers set."""
        _, directives = parse_marked_text_directives(text)
        known, ids = self._longest_remembered(text)
        out = list(ids)
        segments, _ = parse_marked_text(text[len(known):])
        for seg in segments:
            if isinstance(seg, IdsSegment):
                out.extend(seg.ids)
            elif seg.text:
                out.extend(self._tokenize(seg.text, at_start=not out))
        return out, directives

    # -- BaseBackend ---------------------------------------------------------------------------
    def generate(self, s: StreamExecutor, sampling_params: SglSamplingParams, **_: Any):
        ids, directives = self.request_of(s.text_)
        params = SamplingParams.from_sgl(
            sampling_params, seed=directives.seed, logprob_temperatures=directives.logprob_temperatures
        )
        out = self.run(ids, params)
        self._remember_generation(s.text_, ids, out)
        return out.text, out.meta_info

    def generate_stream(self, s: StreamExecutor, sampling_params: SglSamplingParams):
        text, meta = self.generate(s, sampling_params)
        yield text, meta

    def select(self, s: StreamExecutor, choices: list[str], temperature: float, choices_method=None):
        """Score every choice appended to the exact prompt ids (prompt log p0) and pick by `choices_method`."""
        choices_method = choices_method or token_length_normalized
        prompt_ids, seed = self.input_ids_of(s.text_)
        requests = []
        spans = []
        for c in choices:
            c_ids = self._tokenize(c, at_start=not prompt_ids)
            ids = prompt_ids + c_ids
            start = max(len(prompt_ids) - 1, 0)
            requests.append(
                (ids, SamplingParams(max_new_tokens=0, temperature=0.0, return_logprob=True,
                                     logprob_start_len=start, seed=seed))
            )
            spans.append(len(c_ids))
        outs = self.run_batch(requests)
        input_token_logprobs = []
        normalized = []
        for out, n in zip(outs, spans):
            entries = [e for e in out.meta_info["input_token_logprobs"] if e[0] is not None][-n:] if n else []
            input_token_logprobs.append(entries)
            normalized.append(float(np.mean([e[0] for e in entries])) if entries else float("-inf"))
        decision: ChoicesDecision = choices_method(
            choices=choices,
            normalized_prompt_logprobs=normalized,
            input_token_logprobs=input_token_logprobs,
            output_token_logprobs=[[] for _ in choices],
        )
        return decision
