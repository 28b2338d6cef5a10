"""Every eval method runs through one `MethodRunner` on the tiny engine and yields the same record shape."""

from __future__ import annotations

import pytest

from forerun.eval.harness.settings import DEFAULT_METHODS, METHODS, PREDICTIVE_METHODS, EvalSettings, parse_methods

FIELDS = {"response_ids", "finished", "call_time_s", "num_calls", "all_calls", "transitions", "transitions_per_call",
          "time_per_call_s", "log_likelihood", "confidence", "extra", "wall_s", "tokens_decoded"}


def test_parse_methods():
    assert parse_methods("greedy, power-smc,greedy") == ["greedy", "power-smc"]
    assert parse_methods("default") == list(DEFAULT_METHODS)
    every = parse_methods("all")
    assert set(every) == set(METHODS) - set(PREDICTIVE_METHODS)
    with pytest.raises(ValueError, match="unknown method"):
        parse_methods("power-mhh")
    with pytest.raises(ValueError, match="empty"):
        parse_methods(" , ")


def test_settings_record_what_defines_each_method():
    s = EvalSettings().for_dataset("math500")
    assert s.for_method("greedy") == {"max_new_tokens": s.n, "alpha": 4.0, "tau": 0.25}
    assert s.for_method("presto-entropy-cut")["beta"] == 4.0
    assert s.for_method("presto-power-mh-predictive")["traversal"] == "predictive"
    assert s.for_method("power-smc")["particles"] == s.smc_particles
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
        seq = runner.run(method.removeprefix("presto-").removesuffix("-predictive"), ids, "p", 7)
        assert seq["response_ids"] == out["response_ids"]  # identical chains (float64 tiny model)


def test_presto_multitry_mh_prefetches_at_the_eval_default(tiny_runner):
    """Without --npf, N_pf = 8 would realize one MultiTryMH transition per call (one takes 2M - 1 = 7 requests):
    the eval default gives it its own budget, and the chain realizes at least 2 transitions per call."""
    from forerun.eval.harness.methods import MethodRunner

    rt, _ = tiny_runner
    settings = EvalSettings(n=32, K=10)
    assert settings.npf_for("power-mh") == 8 and settings.npf_for("multitry-mh") >= 14
    assert EvalSettings(npf=5).npf_for("multitry-mh") == 5
    assert settings.for_method("presto-multitry-mh")["npf"] == settings.npf_for("multitry-mh")
    runner = MethodRunner(rt.backend, settings)
    out = runner.run("presto-multitry-mh", rt.tokenizer.encode("Compute 2 + 2."), "p", 7)
    assert out["transitions_per_call"] >= 2, out["transitions_per_call"]
