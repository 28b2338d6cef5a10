"""`logprob_start_len` at the prompt's length: SGLang's scheduler aborts only a start *beyond* the prompt
(`if req.logprob_start_len > len(req.origin_input_ids)`, pinned in backends/test_server_contract.py) and answers
the prompt length itself - its own default for return_logprob - with empty input lists."""

from __future__ import annotations

import pytest

from forerun.runtime_ext.engine import EmbeddedEngine
from forerun.runtime_ext.protocol import EngineError, SamplingParams


@pytest.fixture(scope="module")
def engine():
    with EmbeddedEngine.from_spec("tiny") as eng:
        yield eng


@pytest.mark.parametrize("max_new_tokens", [0, 3])
def test_a_start_at_the_prompt_length_scores_no_prompt_position(engine, max_new_tokens):
    ids = engine.tokenizer.encode("Hello")
    params = dict(max_new_tokens=max_new_tokens, temperature=0.0, return_logprob=True, top_logprobs_num=2)
    out = engine.generate(ids, SamplingParams(logprob_start_len=len(ids), **params))
    assert out.meta_info["input_token_logprobs"] == [] and out.meta_info["input_top_logprobs"] == []
    plain = engine.generate(ids, SamplingParams(**params))
    assert out.output_ids == plain.output_ids and len(out.output_ids) == max_new_tokens
    assert out.meta_info["output_token_logprobs"] == plain.meta_info["output_token_logprobs"]
    with pytest.raises(EngineError, match="logprob_start_len"):
        engine.generate(ids, SamplingParams(logprob_start_len=len(ids) + 1, **params))


def test_the_default_start_returns_empty_prompt_lists_as_sglang(engine):
    """SGLang's scheduler turns logprob_start_len -1 with return_logprob into the prompt length (L3264); without
    return_logprob no input keys."""
    ids = engine.tokenizer.encode("Hello")
    out = engine.generate(ids, SamplingParams(max_new_tokens=2, temperature=0.0, return_logprob=True))
    assert out.meta_info["input_token_logprobs"] == [] and "input_top_logprobs" not in out.meta_info
    assert "input_token_logprobs" not in engine.generate(ids, SamplingParams(max_new_tokens=2)).meta_info
