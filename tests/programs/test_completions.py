"""The EOS-stopping completion program on the tiny embedded engine, and its meta_info parsing."""

from __future__ import annotations

import numpy as np
import pytest

from forerun.programs.baselines import BaselineConfig, DecodingBaseline
from forerun.programs.completions import CompletionRequest, ProgramCompletionModel, completion_from_meta
from forerun.programs.power_smc import PowerSMC, PowerSMCConfig
from forerun.runtime_ext.protocol import EngineError, SamplingParams


def test_program_matches_direct_engine_calls(tiny_loaded_backend):
    loaded, backend = tiny_loaded_backend
    prompt = tuple(loaded.tokenizer.encode("hello"))
    reqs = [CompletionRequest(prompt, 6, 0.25, 7), CompletionRequest(prompt + (100,), 5, 0.0, 0)]
    out = ProgramCompletionModel(backend).complete(reqs)
    for o, r in zip(out, reqs):
        d = backend.engine.generate(list(r.prefix_ids), SamplingParams(max_new_tokens=r.max_tokens, temperature=r.temperature,
                                                                       seed=r.seed, return_logprob=True))
        assert tuple(o.ids) == d.output_ids
        assert np.allclose(o.logp0, d.output_logp0)
        assert o.finished == (d.meta_info["finish_reason"]["type"] == "stop")


def test_a_completion_runs_past_a_template_marker_that_is_no_eos(tiny_loaded_backend):
    """A completion stops at the model's EOS or after max_tokens only.  The tiny model's EOS is <|endoftext|>; its
    chat template (chatml) has the stop string "<|im_end|>", which SGLang's interpreter adds to every gen: a
    completion that drew <|im_end|> used to end there, reported finished (seed 34 draws it as token 35 of 40).
    Oracle: the same request on the engine without stop strings, which draws <|im_end|> mid-sequence."""
    loaded, backend = tiny_loaded_backend
    assert backend.chat_template.stop_str == ("<|im_end|>",) and loaded.eos_token_ids == (loaded.tokenizer.eos_token_id,)
    im_end = loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end not in loaded.eos_token_ids
    req = CompletionRequest(tuple(loaded.tokenizer.encode("The answer is")), 40, 1.0, 34)
    direct = backend.engine.generate(list(req.prefix_ids), SamplingParams(max_new_tokens=40, temperature=1.0, seed=34))
    assert im_end in direct.output_ids[:-1] and len(direct.output_ids) == 40  # the case this test is about
    out = ProgramCompletionModel(backend).complete([req])[0]
    assert tuple(out.ids) == direct.output_ids and not out.finished


def test_meta_info_parsing():
    meta = {"output_token_logprobs": [[-0.1, 5, "a"], [-0.2, 2, ""]], "output_token_logp0": [-0.5, -0.7],
            "output_token_entropy": [1.0, 0.5], "finish_reason": {"type": "stop", "matched": 2}}
    c = completion_from_meta(meta)
    assert list(c.ids) == [5, 2] and c.finished and np.allclose(c.entropy, [1.0, 0.5])
    c = completion_from_meta(dict(meta, finish_reason={"type": "length", "length": 2}, output_token_entropy=None))
    assert not c.finished and np.isnan(c.entropy).all()
    with pytest.raises(EngineError, match="logp0"):
        completion_from_meta({"output_token_logprobs": [[-0.1, 5, "a"]]})


def test_power_smc_and_baselines_run_on_the_engine(tiny_loaded_backend):
    loaded, backend = tiny_loaded_backend
    model = ProgramCompletionModel(backend)
    prompt = loaded.tokenizer.encode("abc")
    cfg = PowerSMCConfig(particles=4, max_new_tokens=8, block_size=4, ramp_tokens=4, seed=3)
    a, b = PowerSMC(model, cfg).run(prompt), PowerSMC(model, cfg).run(prompt)
    assert a.response_ids == b.response_ids and 1 <= a.num_calls <= 2
    assert 0 < len(a.response_ids) <= 8 and np.isfinite(a.log_likelihood)
    best = DecodingBaseline(model, BaselineConfig(kind="best-of-n", samples=3, max_new_tokens=6)).run(prompt)
    assert best.num_calls == 1 and len(best.extra["scores"]) == 3
