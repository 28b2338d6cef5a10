"""The suffix-proposal @sgl.function on token-exact backends: a fake backend over the toy model, the tiny engine."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from forerun.programs.proposals import ProgramProposalModel
from forerun.programs.suffixes import SuffixRequest
from forerun.testing.logit_table_model import LogitTableModel
from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
from forerun.programs.sampler_factory import make_sampler
from forerun.runtime_ext.protocol import EngineError, GenerateOutput, SamplingParams
from forerun.runtime_ext.backends.token_exact import TokenExactBackend
from forerun.testing.chains import assert_same_chain


class _NoTokenizer:
    def encode(self, text, add_special_tokens=False):
        raise AssertionError(f"the proposal program must send ids only, got text {text!r}")

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{int(t)}>" for t in ids)  # ToyBackend's output text


class ToyBackend(TokenExactBackend):
    """A token-exact frontend backend whose engine is the numpy toy model (records every request)."""

    def __init__(self, model: LogitTableModel, *, short_by: int = 0, entropy: bool = True,
                 by_temperature: bool = True) -> None:
        super().__init__(_NoTokenizer())
        self.model = model
        self.short_by = short_by
        self.entropy = entropy
        self.by_temperature = by_temperature
        self.seen: list[tuple[tuple[int, ...], SamplingParams]] = []
        self.lock = threading.Lock()

    def run(self, input_ids, params: SamplingParams) -> GenerateOutput:
        with self.lock:
            self.seen.append((tuple(input_ids), params))
        req = SuffixRequest(tuple(input_ids), params.max_new_tokens, params.temperature, params.seed)
        s = self.model.generate([req])[0]
        n = len(s.ids) - self.short_by
        meta = {
            "output_token_logprobs": [[float(q), int(t), str(t)] for q, t in zip(s.logq[:n], s.ids[:n])],
            "output_token_logp0": [float(x) for x in s.logp0[:n]],
        }
        if self.entropy:
            meta["output_token_entropy"] = [float(x) for x in s.entropy[:n]]
        if params.logprob_temperatures and self.by_temperature:
            # what the embedded engine returns: log q_τ'(y_t | ·) over the full vocabulary, one row per τ'
            meta["logprob_temperatures"] = list(params.logprob_temperatures)
            ids = list(input_ids)
            rows = [[] for _ in params.logprob_temperatures]
            for tok in s.ids[:n]:
                for row, t in zip(rows, params.logprob_temperatures):
                    row.append(float(self.model.log_q(ids[-1], len(ids), t)[tok]))
                ids.append(int(tok))
            meta["output_token_logq_by_temperature"] = rows
        return GenerateOutput(input_ids=tuple(input_ids), output_ids=tuple(int(t) for t in s.ids[:n]),
                              text="".join(f"<{int(t)}>" for t in s.ids[:n]),
                              meta_info=meta)


def test_program_sends_exact_ids_seed_and_params():
    model = LogitTableModel(5, seed=1)
    backend = ToyBackend(model)
    pm = ProgramProposalModel(backend)
    reqs = [SuffixRequest((1, 2, 3), 4, 0.25, 11), SuffixRequest((1, 2), 5, 0.5, 12), SuffixRequest((4,), 1, 1.0, 13)]
    out = pm.generate(reqs)
    direct = model.generate(reqs)
    for o, d in zip(out, direct):
        assert np.array_equal(o.ids, d.ids) and np.allclose(o.logq, d.logq) and np.allclose(o.logp0, d.logp0)
    seen = {ids: p for ids, p in backend.seen}
    assert set(seen) == {(1, 2, 3), (1, 2), (4,)}
    p = seen[(1, 2)]
    assert (p.max_new_tokens, p.temperature, p.seed, p.ignore_eos, p.return_logprob, p.top_k, p.top_p) == (
        5, 0.5, 12, True, True, -1, 1.0)
    assert pm.last_wall_time >= 0


def test_samplers_run_unchanged_on_the_program_path():
    for kind in ("power-mh", "entropy-cut", "multitry-mh"):
        temps = (0.25, 0.5, 1.0) if kind == "multitry-mh" else ()
        toy = LogitTableModel(4, seed=2, tempered_temperatures=temps)
        pm = ProgramProposalModel(ToyBackend(LogitTableModel(4, seed=2)), tempered_temperatures=temps)
        cfg = SamplerConfig(kind=kind, response_length=6, block_size=6, steps_per_block=5, seed=4)
        a = make_sampler(toy, cfg).run([1, 2])
        b = make_sampler(pm, cfg, presto=True, prefetch=PrefetchConfig(budget=4)).run([1, 2])
        assert_same_chain(a, b, kind)


def test_multitry_program_sends_the_temperature_marker_and_reads_the_arrays():
    temps = (0.25, 0.5, 1.0)
    toy = LogitTableModel(5, seed=3, tempered_temperatures=temps)
    backend = ToyBackend(LogitTableModel(5, seed=3))
    pm = ProgramProposalModel(backend, tempered_temperatures=temps)
    reqs = [SuffixRequest((1, 2, 3), 4, 0.25, 11), SuffixRequest((4,), 3, 0.25, 12)]
    out = pm.generate(reqs)
    assert all(p.logprob_temperatures == temps for _, p in backend.seen)
    for o, d in zip(out, toy.generate(reqs)):
        assert o.logq_by_temp.shape == (3, len(d.ids))
        assert np.allclose(o.logq_by_temp, d.logq_by_temp)
    # without MultiTryMH no marker is sent and no arrays are read
    ProgramProposalModel(backend).generate(reqs[:1])
    assert backend.seen[-1][1].logprob_temperatures == ()


def test_short_output_and_missing_arrays_are_errors():
    with pytest.raises(EngineError, match="expected 4"):
        ProgramProposalModel(ToyBackend(LogitTableModel(4), short_by=1)).generate([SuffixRequest((1,), 4, 1.0, 1)])
    pm = ProgramProposalModel(ToyBackend(LogitTableModel(4), by_temperature=False), tempered_temperatures=(0.5,))
    with pytest.raises(EngineError, match="output_token_logq_by_temperature"):
        pm.generate([SuffixRequest((1,), 2, 1.0, 1)])
    # a backend without per-token entropy: an error only when the sampler needs it (EntropyCut asks for it)
    no_entropy = ToyBackend(LogitTableModel(4), entropy=False)
    with pytest.raises(EngineError, match="EntropyCut"):
        ProgramProposalModel(no_entropy, require_entropy=True).generate([SuffixRequest((1,), 2, 1.0, 1)])
    (s,) = ProgramProposalModel(no_entropy).generate([SuffixRequest((1,), 2, 1.0, 1)])  # the default (PowerMH)
    assert len(s.ids) == 2 and np.all(np.isnan(s.entropy))
    with pytest.raises(ValueError, match="tempered_temperatures"):
        ProgramProposalModel(no_entropy, tempered_temperatures=(0.0,))
    with pytest.raises(ValueError, match="max_tokens"):
        SuffixRequest((1,), 0, 1.0, 1)
    with pytest.raises(ValueError, match="prefix_ids"):
        SuffixRequest((), 1, 1.0, 1)


@pytest.fixture(scope="module", params=["float64", "float32", "bfloat16"])
def tiny_backend(request):
    """The tiny model in every dtype the engine offers (batch-invariant in each: identical chains)."""
    models = pytest.importorskip("forerun.runtime_ext.engine.models")
    from forerun.runtime_ext.backends.embedded import EmbeddedBackend
    from forerun.runtime_ext.engine import EmbeddedEngine

    loaded = models.load_model("tiny", dtype=request.param)
    engine = EmbeddedEngine(loaded)
    assert engine.batch_invariant
    yield loaded, EmbeddedBackend(engine)
    engine.close()


def test_tiny_engine_program_matches_direct_engine_calls(tiny_backend):
    loaded, backend = tiny_backend
    prompt = tuple(loaded.tokenizer.encode("héllo"))
    reqs = [SuffixRequest(prompt + (200, 195), 5, 0.25, 7), SuffixRequest(prompt, 6, 0.25, 8)]
    out = ProgramProposalModel(backend).generate(reqs)
    for o, r in zip(out, reqs):
        d = backend.engine.generate(list(r.prefix_ids), SamplingParams(max_new_tokens=r.max_tokens, temperature=r.temperature,
                                                                       seed=r.seed, ignore_eos=True, return_logprob=True))
        assert tuple(o.ids) == d.output_ids
        assert np.allclose(o.logp0, d.output_logp0) and np.allclose(o.logq, d.output_logq)


def test_tiny_engine_suffixes_run_through_the_templates_stop_string(tiny_backend):
    """The embedded backend's chatml template stops every gen at "<|im_end|>", which the engine matches with special
    tokens spelled out, ignore_eos or not (as SGLang 0.5.23's Req.tail_str does).  Suffix proposals run without the
    template's stop strings (`without_template_stops`), so a suffix that draws <|im_end|> still has exactly
    max_tokens tokens: those of the direct engine call with EOS ignored and no stop string."""
    loaded, backend = tiny_backend
    assert "<|im_end|>" in backend.chat_template.stop_str
    im_end = loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = tuple(loaded.tokenizer.encode("count: "))
    reqs = [SuffixRequest(prompt, 24, 1.0, seed) for seed in range(64)]
    out = ProgramProposalModel(backend).generate(reqs)
    crossed = 0
    for o, r in zip(out, reqs):
        d = backend.engine.generate(list(r.prefix_ids), SamplingParams(max_new_tokens=r.max_tokens, temperature=1.0,
                                                                       seed=r.seed, ignore_eos=True))
        assert tuple(o.ids) == d.output_ids and len(o.ids) == 24
        crossed += im_end in d.output_ids[:-1]
    assert crossed >= 1  # some suffix drew <|im_end|> before its last token (the template's stop would cut it)


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
def test_tiny_engine_identical_chains(tiny_backend, kind):
    loaded, backend = tiny_backend
    temps = (0.25, 0.5, 1.0) if kind == "multitry-mh" else ()
    pm = ProgramProposalModel(backend, tempered_temperatures=temps)
    prompt = loaded.tokenizer.encode("wörld")
    seeds, steps = (range(1), 3) if kind == "multitry-mh" else (range(2), 4)
    for seed in seeds:
        cfg = SamplerConfig(kind=kind, response_length=8, block_size=4, steps_per_block=steps, seed=seed)
        a = make_sampler(pm, cfg).run(prompt)
        b = make_sampler(pm, cfg, presto=True, prefetch=PrefetchConfig(budget=4)).run(prompt)
        assert_same_chain(a, b)


@pytest.mark.slow
def test_default_model_identical_chain_one_prompt():
    from forerun.programs.proposals import proposal_model_for
    from forerun.programs.prompts import chat_prompt_ids
    from forerun.runtime_ext.runtime import open_runtime

    runtime = open_runtime("default")
    backend = runtime.backend
    ids = chat_prompt_ids(runtime.tokenizer, "What is 7 times 8? Answer briefly.")
    for kind in ("power-mh", "entropy-cut", "multitry-mh"):  # MultiTryMH on the 49 152-token vocabulary
        cfg = SamplerConfig(kind=kind, response_length=16, block_size=16, steps_per_block=6, seed=10086)
        pm = proposal_model_for(backend, kind, cfg.mtm_temperatures)
        a = make_sampler(pm, cfg).run(ids)
        b = make_sampler(pm, cfg, presto=True, prefetch=PrefetchConfig(budget=20)).run(ids)
        assert_same_chain(a, b)
    runtime.close()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_default_model_identical_chains_ten_math500_prompts(dtype):
    """Issue 14: sequential and PreSTO PowerMH chains of 10 MATH500 prompts at n = 64, K = 30 are identical
    in float32 and in bf16 (the engine is batch-invariant in both)."""
    from forerun.programs.proposals import proposal_model_for
    from forerun.eval.datasets.loading import load_prompts
    from forerun.programs.prompts import chat_prompt_ids
    from forerun.runtime_ext.runtime import open_runtime

    with open_runtime("default", dtype) as runtime:
        assert runtime.engine.batch_invariant
        cfg = SamplerConfig(kind="power-mh", response_length=64, block_size=64, steps_per_block=30, seed=10086)
        pm = proposal_model_for(runtime.backend, "power-mh")
        for p in load_prompts("math500", limit=10):
            ids = chat_prompt_ids(runtime.tokenizer, p.messages())
            a = make_sampler(pm, cfg).run(ids)
            runtime.engine.flush_cache()  # PreSTO starts from another cache state: must not matter
            b = make_sampler(pm, cfg, presto=True, prefetch=PrefetchConfig(budget=20)).run(ids)
            assert_same_chain(a, b, p.id)
            assert list(a.state.logp0) == list(b.state.logp0)


def test_repeated_request_with_empty_output_text_keeps_exact_ids():
    """A backend that remembers generations by program text must not feed an earlier output back in."""
    class EmptyText(ToyBackend):
        def run(self, input_ids, params):
            out = super().run(input_ids, params)
            return GenerateOutput(input_ids=out.input_ids, output_ids=out.output_ids, text="", meta_info=out.meta_info)

    backend = EmptyText(LogitTableModel(4, seed=1))
    pm = ProgramProposalModel(backend)
    req = SuffixRequest((1, 2, 3), 2, 0.5, 5)
    first, second = pm.generate([req])[0], pm.generate([req])[0]
    assert [ids for ids, _ in backend.seen] == [(1, 2, 3), (1, 2, 3)]
    assert np.array_equal(first.ids, second.ids)


def test_tiny_engine_entropy_cut_resamples_the_first_token(tiny_backend):
    """ΔH_0 = H_0: an EntropyCut chain on the tiny engine draws cut 0 (before: never), sequential and PreSTO."""
    loaded, backend = tiny_backend
    pm = ProgramProposalModel(backend)
    prompt = loaded.tokenizer.encode("wörld")
    cfg = SamplerConfig(kind="entropy-cut", response_length=6, block_size=6, steps_per_block=6, seed=3)
    for presto in (False, True):
        res = make_sampler(pm, cfg, presto=presto, prefetch=PrefetchConfig(budget=4)).run(prompt)
        cuts = [n.cut for c in res.mh_calls for n in c.nodes]
        assert 0 in cuts, f"presto={presto}: cuts {cuts}"
