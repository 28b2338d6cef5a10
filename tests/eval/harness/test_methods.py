"""Every eval method runs through one `MethodRunner` on the tiny engine and yields the same record shape."""

from __future__ import annotations

import pytest

from forerun.eval.harness.settings import (
    DEFAULT_METHODS,
    METHODS,
    PREDICTIVE_METHODS,
    EvalSettings,
    Method,
    parse_methods,
)

FIELDS = {"response_ids", "finished", "call_time_s", "num_calls", "all_calls", "transitions", "transitions_per_call",
          "time_per_call_s", "log_likelihood", "confidence", "extra", "wall_s", "tokens_decoded"}


def test_parse_methods():
    assert parse_methods("greedy, power-smc,greedy") == ["greedy", "power-smc"]
    assert parse_methods("default") == list(DEFAULT_METHODS)
    every = parse_methods("all")
    assert set(every) == set(METHODS) - set(PREDICTIVE_METHODS)
    streaming = {f"presto-{k}-streaming" for k in ("power-mh", "entropy-cut", "multitry-mh")}
    assert streaming <= set(every)  # issue 30: every power sampler, the streaming variants included
    m = Method.parse("presto-entropy-cut-streaming")
    assert (m.sampler, m.presto, m.traversal, m.streaming, m.sequential) == ("entropy-cut", True, "bfs", True,
                                                                             "entropy-cut")
    assert not Method.parse("presto-entropy-cut").streaming and not Method.parse("presto-power-mh-predictive").streaming
    with pytest.raises(ValueError, match="unknown method"):
        Method.parse("presto-power-mh-streaming-predictive")
    with pytest.raises(ValueError, match="unknown method"):
        parse_methods("power-mhh")
    with pytest.raises(ValueError, match="empty"):
        parse_methods(" , ")
    with pytest.raises(ValueError, match="item 2 of 'greedy,,power-mh' is empty"):  # was: the item dropped
        parse_methods("greedy,,power-mh")


def test_settings_record_what_defines_each_method():
    s = EvalSettings().for_dataset("math500")
    assert s.for_method("greedy") == {"max_new_tokens": s.n}  # argmax: it recorded α and τ, which it ignores
    assert s.for_method("low-temp") == {"max_new_tokens": s.n, "alpha": 4.0, "tau": 0.25}
    assert s.for_method("presto-entropy-cut")["beta"] == 4.0
    assert s.for_method("presto-power-mh-predictive")["traversal"] == "predictive"
    assert s.for_method("power-smc")["particles"] == s.smc_particles
    assert s.for_method("power-smc")["final"] == "sample"
    assert EvalSettings(smc_final="max-logp0").for_dataset("gpqa").for_method("power-smc")["final"] == "max-logp0"
    assert s.for_method("presto-power-mh-streaming")["streaming"] is True
    assert s.for_method("presto-power-mh")["streaming"] is False
    with pytest.raises(ValueError, match="smc_final"):
        EvalSettings(smc_final="argmax")
    with pytest.raises(ValueError, match="best_of_select"):
        EvalSettings(best_of_select="logp")
    with pytest.raises(ValueError, match="block"):
        EvalSettings(n=32, block=5)
    with pytest.raises(ValueError, match="resolved"):
        EvalSettings().for_method("greedy")  # n depends on the dataset


def test_per_dataset_budgets_are_the_papers_scaled_and_overridable():
    s = EvalSettings()
    assert (s.n_for("math500"), s.n_for("aime"), s.n_for("lcb-v5"), s.n_for("gpqa")) == (32, 214, 85, 32)
    t = EvalSettings(n=16, budgets=(("aime", 64),))
    assert (t.n_for("math500"), t.n_for("aime")) == (16, 64)
    assert t.for_dataset("aime").for_method("power-mh")["n"] == 64
    with pytest.raises(ValueError, match="does not divide"):
        EvalSettings(block=16, budgets=(("math500", 32),)).for_dataset("aime")


def test_streaming_methods_default_to_the_cpu_row_count():
    """Without --npf a streaming method runs CPU_STREAM_ROWS rows at once (as bench presto on the embedded engine),
    the round-based ones CPU_NPF; MultiTryMH, for which neither prefetches, its own default; --npf wins."""
    from forerun.eval.harness.methods import MethodRunner
    from forerun.eval.harness.settings import CPU_NPF
    from forerun.programs.sampler_config import CPU_STREAM_ROWS, PrefetchConfig, SamplerConfig

    s = EvalSettings().for_dataset("math500")
    assert (CPU_STREAM_ROWS, CPU_NPF) == (6, 8)
    assert s.for_method("presto-power-mh-streaming")["npf"] == 6
    assert s.for_method("presto-entropy-cut-streaming")["npf"] == 6
    assert s.for_method("presto-power-mh")["npf"] == 8 and s.for_method("presto-power-mh-predictive")["npf"] == 8
    own = PrefetchConfig().resolved(SamplerConfig(kind="multitry-mh", steps_per_block=s.K)).budget
    assert s.for_method("presto-multitry-mh-streaming")["npf"] == s.for_method("presto-multitry-mh")["npf"] == own
    assert EvalSettings(npf=12).for_dataset("math500").for_method("presto-power-mh-streaming")["npf"] == 12
    runner = MethodRunner(object(), s)  # the sampler the runner builds gets what the record says
    assert runner._mh(Method.parse("presto-power-mh-streaming"), 0).prefetch.budget == 6
    assert runner._mh(Method.parse("presto-power-mh"), 0).prefetch.budget == 8


@pytest.fixture(scope="module")
def tiny_runner():
    from forerun.classifiers.certainty import CertaintyClassifier
    from forerun.eval.harness.methods import MethodRunner
    from forerun.runtime_ext.runtime import open_runtime

    with open_runtime("tiny") as rt:
        settings = EvalSettings(n=6, K=3, npf=4, best_of=3, smc_particles=4, smc_block=3, smc_ramp=3)
        yield rt, MethodRunner(rt.backend, settings, classifier=CertaintyClassifier.uniform_prior())


@pytest.mark.parametrize("method", METHODS)
def test_every_method_runs_on_the_tiny_engine(tiny_runner, method):
    rt, runner = tiny_runner
    ids = rt.tokenizer.encode("Compute 2 + 2.")
    out = runner.run(method, ids, "p", 7)
    assert set(out) == FIELDS
    assert 0 < len(out["response_ids"]) <= 6 and out["num_calls"] >= 1
    mh = method not in ("greedy", "low-temp", "best-of-n", "power-smc")
    assert (out["transitions"] == 3) if mh else (out["transitions"] is None)
    # tokens decoded: the compute-matched budget (every sample, particle and proposal, rejected ones included)
    if method in ("greedy", "low-temp"):
        assert out["tokens_decoded"] == len(out["response_ids"])
    elif mh:  # the block (n = 6) plus at least one token per proposal of each of the 3 transitions
        assert out["tokens_decoded"] >= 6 + 3
    else:
        assert out["tokens_decoded"] > len(out["response_ids"])
    if method.startswith("presto-"):
        sequential = method.removeprefix("presto-").removesuffix("-predictive").removesuffix("-streaming")
        seq = runner.run(sequential, ids, "p", 7)
        assert seq["response_ids"] == out["response_ids"]  # identical chains (float64 tiny model)
        assert seq["extra"]["history"] == out["extra"]["history"]  # the same accept/reject decisions
        # the program that ran is the one the name says (streaming rows vs round-based calls)
        assert out["extra"]["sampler"].startswith("streaming-") == method.endswith("-streaming")


UNUSED_VALUES = {"block": 3, "K": 2, "npf": 2, "alpha": 2.0, "beta": 2.0, "best_of": 2, "best_of_select": "logp0",
                 "smc_particles": 3, "smc_block": 2, "smc_ramp": 2, "smc_ess": 1.0, "smc_final": "max",
                 "fixed_horizon": True}
"""A value other than the tiny runner's for every method-specific setting."""
TIMINGS = ("wall_s", "call_time_s", "time_per_call_s")


@pytest.mark.parametrize("method", METHODS)
def test_settings_a_method_is_said_not_to_use_do_not_change_its_output(tiny_runner, method):
    """`settings_used_by` decides what --resume compares: a setting left out of it must not change what the method
    produces.  Oracle: the method run on the tiny engine with every setting it is said not to use changed at once
    gives the same tokens, calls, transitions and decisions as without the change."""
    from dataclasses import replace

    from forerun.eval.harness.methods import MethodRunner
    from forerun.eval.harness.settings import settings_used_by

    rt, runner = tiny_runner
    unused = {k: v for k, v in UNUSED_VALUES.items() if k not in settings_used_by(method)}
    assert set(UNUSED_VALUES) | set(settings_used_by(method)) >= set(EvalSettings().to_json())  # none forgotten
    changed = MethodRunner(rt.backend, replace(runner.settings, **unused), classifier=runner.classifier)
    ids = rt.tokenizer.encode("Compute 2 + 2.")
    want = {k: v for k, v in runner.run(method, ids, "p", 7).items() if k not in TIMINGS}
    got = {k: v for k, v in changed.run(method, ids, "p", 7).items() if k not in TIMINGS}
    assert got == want, sorted(unused)
    if method == "greedy":
        assert "alpha" in unused


def test_selection_rules_name_the_chosen_rule_and_its_bias():
    from forerun.programs.selection_rules import FINAL_RULES, SELECT_RULES

    s = EvalSettings(best_of_select="logp0", smc_final="max-logp0")
    rules = s.selection_rules(["greedy", "best-of-n", "power-smc"])
    assert rules == {"best-of-n": f"best-of-n selects by logp0: {SELECT_RULES['logp0']}",
                     "power-smc": f"power-smc selects by max-logp0: {FINAL_RULES['max-logp0']}"}
    assert "favours short" in rules["power-smc"]  # the bias is printed with the rule
    assert EvalSettings().selection_rules(["greedy", "power-mh"]) == {}


def test_smc_final_reaches_power_smc(tiny_runner):
    """--smc-final picks the answer among the same particles: max-logp0's answer has the largest Σ log p0 of the
    three rules' answers (Σ = mean log p0 × length, from the records), and each record names its rule."""
    from dataclasses import replace

    from forerun.eval.harness.methods import MethodRunner

    rt, runner = tiny_runner
    ids = rt.tokenizer.encode("Name a prime.")
    picks = {}
    for final in ("sample", "max", "max-logp0"):
        r = MethodRunner(rt.backend, replace(runner.settings, smc_final=final, smc_particles=6))
        picks[final] = r.run("power-smc", ids, "p", 3)
        assert picks[final]["extra"]["final"] == final
    assert len({tuple(o["extra"]["ess"]) for o in picks.values()}) == 1  # the same particles every time
    total = {f: o["log_likelihood"] * len(o["response_ids"]) for f, o in picks.items()}
    assert len({o["extra"]["chosen"] for o in picks.values()}) == 3  # seed 3: the rules disagree (teeth)
    assert total["max-logp0"] > max(total["sample"], total["max"]), total
