"""`forerun sample` / `forerun bench presto` on the tiny model (fast) and argument handling."""

from __future__ import annotations

import json

import pytest

from forerun.eval.presto.bench import PairResult, format_table
from forerun.cli.main import build_parser, main
from forerun.cli.presto import default_stream_rows
from forerun.testing.logit_table_model import LogitTableModel
from forerun.programs.records import read_node_records
from forerun.programs.sampler_config import CPU_STREAM_ROWS, SamplerConfig, PrefetchConfig
from forerun.programs.sampler_factory import make_sampler


def test_parser_defaults_and_paper_flag():
    from forerun.cli.presto import _settings

    args = build_parser().parse_args(["bench", "presto"])
    assert args.samplers == ["power-mh"] and args.prompts == 3 and args.dataset == "math500"
    st = _settings(args)
    assert st["block"] == st["n"] and st["npf"] == 20 and st["seed"] == 10086
    paper = _settings(build_parser().parse_args(["bench", "presto", "--paper"]))
    assert paper == dict(n=1024, block=1024, K=100, npf=20, alpha=4.0, seed=10086)
    st = _settings(build_parser().parse_args(["sample", "--prompt", "x", "--n", "12", "--K", "3"]))
    assert st["n"] == st["block"] == 12 and st["K"] == 3
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sample", "--prompt", "x", "--dataset", "math500"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "presto", "--npf", "0"])


def test_sample_json_and_records(tmp_path, capsys):
    rec = tmp_path / "nodes.jsonl"
    rc = main(["sample", "--sampler", "power-mh", "--presto", "--npf", "4", "--prompt", "héllo", "--model", "tiny",
               "--n", "6", "--K", "5", "--records", str(rec), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sampler"] == "presto-power-mh" and len(out["response_ids"]) == 6 and out["transitions"] == 5
    assert sum(out["transitions_per_call_list"]) + sum(out["transitions_per_reuse_round"]) == 5
    assert len(out["call_times_s"]) == out["calls"] and out["generated_requests"] <= out["distinct_requests"]
    nodes = read_node_records(rec)
    assert nodes and sum(n.realized for n in nodes) == 5
    assert {"prompt_id", "call_index", "node_id", "depth", "cut", "parent_cut", "cut_fraction", "accepts_on_path",
            "accept_prob", "certainty_class", "realized"} <= set(json.loads(rec.read_text().splitlines()[0]))


def test_bench_presto_tiny_prints_table(capsys):
    rc = main(["bench", "presto", "--model", "tiny", "--prompts", "1", "--n", "6", "--K", "4", "--npf", "4",
               "--samplers", "power-mh", "entropy-cut", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["sampler"]: r for r in out["rows"]}
    assert set(rows) == {"power-mh", "entropy-cut"}
    for r in rows.values():
        assert r["identical_chains"] == r["prompts"] == 1
        assert r["transitions_per_call"][0] == r["transitions_per_call_table2"][0] == 1.0
        assert r["transitions_per_call"][1] == pytest.approx(r["transitions_per_call_table2"][1])  # one prompt
        assert r["presto_per_call"]["generated_requests"] <= 4
        assert r["reduction_in_calls"] == pytest.approx(r["speedup_eq20"] * r["increase_in_time_per_call"])


def test_sample_rejects_bad_input(capsys):
    assert main(["sample", "--prompt", "", "--model", "tiny", "--n", "4", "--K", "2"]) == 2
    assert "prompt" in capsys.readouterr().err
    assert main(["sample", "--prompt", "x", "--model", "tiny", "--n", "6", "--block", "4"]) == 2
    assert "--block B must divide --n n=6, got 4" in capsys.readouterr().err  # the flags, not the fields
    assert main(["sample", "--prompt", "x", "--model", "/nonexistent/model", "--n", "4"]) == 2


def test_bench_presto_budget_unit_and_reuse_flags(capsys):
    base = ["bench", "presto", "--model", "tiny", "--prompts", "1", "--n", "6", "--K", "6", "--npf", "3", "--json"]
    assert main(base + ["--budget-unit", "node", "--no-reuse"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["meta"]["budget_unit"] == "node" and out["meta"]["reuse"] is False
    (row,) = out["rows"]
    assert row["presto_per_call"]["nodes_scored"] <= 3 and row["identical_chains"] == 1
    assert main(base + ["--call-overhead", "2"]) == 2  # κ0 needs the predictive rule
    assert "--call-overhead applies only to the round-based predictive rule" in capsys.readouterr().err


def test_table_ratios_from_one_run():
    model = LogitTableModel(4, seed=1)
    cfg = SamplerConfig(response_length=6, block_size=6, steps_per_block=8, seed=3)
    pair = PairResult("power-mh")
    ticks = iter(range(10_000))
    for pid in ("a", "b"):
        pair.sequential.append(make_sampler(model, cfg).run([1, 2], prompt_id=pid))
        pair.presto.append(make_sampler(model, cfg, presto=True, prefetch=PrefetchConfig(budget=8)).run([1, 2], prompt_id=pid))
    row = pair.table_row()
    mean = lambda xs: sum(xs) / len(xs)
    assert row["transitions_per_call_table2"][1] == pytest.approx(8 / mean([r.num_calls for r in pair.presto]))
    assert row["transitions_per_call"][1] == pytest.approx(mean([8 / r.num_calls for r in pair.presto]))
    assert row["speedup_eq20"] == pytest.approx(mean([r.call_time for r in pair.sequential]) /
                                                mean([r.call_time for r in pair.presto]))
    assert row["identical_chains"] == 2
    assert "power-mh" in format_table([row])


def test_predictive_traversal_from_a_trained_classifier(tmp_path, capsys):
    pytest.importorskip("forerun.classifiers.certainty")
    rec, clf = tmp_path / "nodes.jsonl", tmp_path / "clf.json"
    for seed in ("1", "2"):
        assert main(["sample", "--presto", "--prompt", "abc", "--model", "tiny", "--n", "8", "--K", "8",
                     "--seed", seed, "--records", str(rec), "--json"]) == 0
    assert main(["classifier", "train", "--records", str(rec), "--out", str(clf), "--allow-missing-classes",
                 "--json"]) == 0
    capsys.readouterr()
    args = ["sample", "--prompt", "abc", "--model", "tiny", "--n", "8", "--K", "8", "--seed", "3", "--json"]
    assert main(args) == 0
    seq = json.loads(capsys.readouterr().out)
    assert main(args + ["--presto", "--traversal", "predictive", "--classifier", str(clf)]) == 0
    pre = json.loads(capsys.readouterr().out)
    assert pre["response_ids"] == seq["response_ids"] and pre["history"] == seq["history"]
    # without --classifier: the shipped one (tests/cli/test_classifier_shipped.py)


# -- --backend URL: the samplers unchanged on a launched SGLang server (the stand-in here) ----------------
def test_sample_presto_on_a_server_backend(capsys):
    from forerun.runtime_ext.standin.server import StandInServer

    with StandInServer() as srv:
        argv = ["sample", "--backend", srv.url, "--sampler", "power-mh", "--presto", "--prompt", "hi", "--n", "8",
                "--K", "3", "--json"]
        assert main(argv) == 0
        out = json.loads(capsys.readouterr().out)
        bodies = srv.generate_bodies()
        assert main([a for a in argv if a != "--presto"]) == 0  # the sequential chain: the same tokens (exactness over HTTP)
        seq = json.loads(capsys.readouterr().out)
    prompt = srv.tokenizer.encode("hi")
    assert out["backend"] == srv.url and out["sampler"] == "presto-power-mh"
    assert len(out["response_ids"]) == 8 and out["transitions"] == 3 and out["confidence"] is None
    assert seq["response_ids"] == out["response_ids"] and seq["history"] == out["history"]
    sent = [b["input_ids"] for b in bodies]
    flat = [ids for s in sent for ids in (s if s and isinstance(s[0], list) else [s])]
    assert flat and all(ids[: len(prompt)] == prompt for ids in flat)
    assert all("text" not in b for b in bodies)


def test_bench_presto_on_a_server_backend(capsys):
    from forerun.runtime_ext.standin.server import StandInServer

    argv = ["bench", "presto", "--prompts", "1", "--n", "6", "--K", "3", "--npf", "4", "--json"]
    with StandInServer() as srv:
        assert main(argv + ["--backend", srv.url]) == 0
        out = json.loads(capsys.readouterr().out)
        assert srv.flushes == 0 and not [p for p, _ in srv.requests if p == "/flush_cache"]  # a shared server: never by default
        assert main(argv + ["--backend", srv.url, "--flush-cache"]) == 0
        flushed = json.loads(capsys.readouterr().out)
        assert srv.flushes == 2  # asked for: before each chain
    assert out["meta"]["backend"] == srv.url and out["meta"]["dtype"] == "server"
    assert out["meta"]["determinism"] == "token for token" and out["meta"]["chains"] == 2
    (row,) = out["rows"]
    assert row["identical_chains"] == 1 and row["transitions_per_call"][0] == 1.0
    assert flushed["rows"][0]["unflushed_chains"] == 0 and flushed["rows"][0]["identical_chains"] == 1
    pred = row["cost_model_prediction"]  # no step timer on a server, yet the rows-free prediction is there
    assert "cost_model" not in out["meta"] and "predicted_speedup" not in pred
    (s_seq, s_pre), (g_seq, g_pre) = row["decode_steps"], row["row_steps"]
    assert s_pre > 0 and pred["speedup_rows_free"] == pytest.approx(s_seq / s_pre)


def test_predict_row_cost_prints_each_variants_speedup_at_that_lambda(capsys):
    argv = ["bench", "presto", "--model", "tiny", "--prompts", "1", "--n", "8", "--K", "4", "--npf", "6",
            "--traversals", "bfs", "streaming", "--no-cost-model", "--predict-row-cost", "0.01", "2"]
    assert main(argv + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    for r in rows:
        (s_seq, s_pre), (g_seq, g_pre) = r["decode_steps"], r["row_steps"]
        at = r["cost_model_prediction"]["speedup_at_row_cost"]
        assert at["0.01"] == pytest.approx((s_seq + 0.01 * g_seq) / (s_pre + 0.01 * g_pre))
        assert at["2"] == pytest.approx((s_seq + 2 * g_seq) / (s_pre + 2 * g_pre))
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "no step timer" in text and text.count("at λ = 0.01 ") == 2 and "where rows are free" in text
    with pytest.raises(SystemExit) as refused:  # a negative λ: a usage error
        main(argv[:-2] + ["-1"])
    assert refused.value.code == 2


def test_a_huge_finite_predict_row_cost_is_a_number_in_the_json(capsys):
    """--predict-row-cost 1e308 (finite, so accepted) printed null: λ·G overflowed to inf / inf."""
    argv = ["bench", "presto", "--model", "tiny", "--prompts", "1", "--n", "8", "--K", "2", "--traversal", "streaming",
            "--no-cost-model", "--predict-row-cost", "1e308", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    (r,) = out["rows"]
    (s_seq, s_pre), (g_seq, g_pre) = r["decode_steps"], r["row_steps"]
    assert "undefined" not in out and g_pre > 0
    assert r["cost_model_prediction"]["speedup_at_row_cost"]["1e+308"] == pytest.approx(g_seq / g_pre, rel=1e-9)


def test_server_backend_samplers_that_need_more_than_a_stock_server_fail_clearly(capsys):
    from forerun.runtime_ext.standin.server import StandInServer, unused_port

    with StandInServer() as srv:
        base = ["sample", "--backend", srv.url, "--prompt", "hi", "--n", "6", "--K", "2"]
        assert main(base + ["--sampler", "entropy-cut"]) == 2
        err = capsys.readouterr().err
        assert "entropy" in err and err.count("\n") == 1
        assert main(base + ["--sampler", "multitry-mh"]) == 2
        err = capsys.readouterr().err
        assert "extra temperatures" in err and err.count("\n") == 1
    with StandInServer(plugin=True) as srv:  # a server plugin that reports the entropy of p0
        assert main(["sample", "--backend", srv.url, "--prompt", "hi", "--n", "6", "--K", "2",
                     "--sampler", "entropy-cut", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["confidence"] is not None
    url = f"http://127.0.0.1:{unused_port()}"
    assert main(["bench", "presto", "--backend", url, "--prompts", "1"]) == 1  # a server failure, not usage
    err = capsys.readouterr().err
    assert err.startswith("forerun bench presto: ") and url in err and err.count("\n") == 1


def test_prompt_runs_get_a_unique_prompt_id_and_records_carry_the_model(tmp_path, capsys):
    from forerun.cli.presto import prompt_id_for_text

    rec = tmp_path / "nodes.jsonl"
    for text in ("first prompt", "second prompt"):
        assert main(["sample", "--presto", "--prompt", text, "--model", "tiny", "--n", "6", "--K", "3",
                     "--records", str(rec), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["prompt_id"] == prompt_id_for_text(text)
    lines = [json.loads(line) for line in rec.read_text().splitlines()]
    assert {line["prompt_id"] for line in lines} == {prompt_id_for_text("first prompt"),
                                                      prompt_id_for_text("second prompt")}
    assert all(line["model"] == "tiny" for line in lines)
    assert prompt_id_for_text("x") == "prompt/2d711642b726" and len(read_node_records(rec)) == len(lines)


# -- N_pf defaults and shortfall (issue 30 item 4), what speculation costs (wasted tokens, repeated requests) ---
def test_bench_presto_multitry_default_budget_prefetches(capsys):
    """No --npf: presto-multitry-mh runs at its default 3(2M − 1) = 21 and realizes >= 2 transitions per call on
    the tiny model, with the sequential chain and no warning."""
    assert main(["bench", "presto", "--model", "tiny", "--prompts", "1", "--samplers", "multitry-mh", "--json"]) == 0
    captured = capsys.readouterr()
    (row,) = json.loads(captured.out)["rows"]
    assert row["npf"] == 21 and row["identical_chains"] == 1
    assert row["transitions_per_call"][1] >= 2.0
    assert row["repeated_requests"] == 0 and 0.0 <= row["wasted_token_fraction"] <= 1.0
    assert "warning" not in captured.err


def test_npf_below_one_level_warns_once(capsys):
    args = ["sample", "--sampler", "multitry-mh", "--presto", "--prompt", "x", "--model", "tiny", "--n", "6", "--K",
            "3", "--json"]
    assert main(args + ["--npf", "8"]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert warnings == [warnings[0]] and warnings[0].startswith(
        "forerun sample: warning: N_pf = 8 cannot prefetch anything for multitry-mh")
    out = json.loads(captured.out)
    assert out["transitions_per_call"] == 1.0 and out["settings"]["npf"] == 8
    assert main(args + ["--npf", "14"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err and json.loads(captured.out)["settings"]["npf"] == 21


def test_wasted_tokens_and_repeated_requests_per_traversal(capsys):
    """Every row reports the PreSTO variant's wasted token share (in [0, 1]) and its repeated requests (0 for the
    round-based traversals); a sequential chain wastes nothing and repeats nothing."""
    assert main(["sample", "--prompt", "x", "--model", "tiny", "--n", "6", "--K", "4", "--json"]) == 0
    seq = json.loads(capsys.readouterr().out)
    assert seq["wasted_token_fraction"] == 0.0 and seq["wasted_tokens"] == 0 and seq["repeated_requests"] == 0
    assert seq["resumed_requests"] == 0
    assert main(["bench", "presto", "--model", "tiny", "--prompts", "1", "--n", "8", "--K", "6", "--npf", "4",
                 "--samplers", "power-mh", "entropy-cut", "--traversals", "bfs", "streaming", "--no-cost-model",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 4
    for r in rows:
        assert 0.0 <= r["wasted_token_fraction"] <= 1.0 and r["identical_chains"] == 1
        assert isinstance(r["repeated_requests"], int) and r["repeated_requests"] >= 0
        assert isinstance(r["resumed_requests"], int) and r["resumed_requests"] >= 0
        if r["traversal"] == "bfs":
            assert r["repeated_requests"] == 0 and r["resumed_requests"] == 0
    assert "waste,rep" in format_table(rows)


def test_row_cost_reaches_the_streaming_variants(capsys):
    """--row-cost is streaming's λ: above K only the walk's own requests run (nothing wasted, one row per transition);
    bench presto records the λ it ran with; a round-based variant is untouched; without the flag on the embedded
    engine --row-cost measured is b/a of the measured step-time fit, and without --row-cost rows are free (λ = 0)."""
    assert main(["bench", "presto", "--model", "tiny", "--prompts", "1", "--n", "8", "--K", "6", "--npf", "8",
                 "--traversals", "bfs", "streaming", "--row-cost", "100", "--no-cost-model", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["meta"]["row_cost"] == 100.0
    rows = {r["traversal"]: r for r in out["rows"]}
    assert rows["streaming"]["wasted_token_fraction"] == 0.0 and rows["streaming"]["identical_chains"] == 1
    assert rows["streaming"]["streaming"]["rows_started_per_window"] * rows["streaming"]["streaming"]["windows"] == 6
    assert rows["bfs"]["identical_chains"] == 1
    assert main(["bench", "presto", "--model", "tiny", "--prompts", "1", "--n", "8", "--K", "4",
                 "--traversals", "streaming", "--row-cost", "measured", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["meta"]["row_cost"] == pytest.approx(_lambda_of(out["meta"]["cost_model"]["fit"]))
    assert main(["bench", "presto", "--model", "tiny", "--prompts", "1", "--n", "8", "--K", "4",
                 "--traversals", "streaming", "--no-cost-model", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["row_cost"] == 0.0
    assert main(["bench", "presto", "--model", "tiny", "--prompts", "1", "--n", "8", "--K", "4",  # λ needs the curve
                 "--traversals", "streaming", "--no-cost-model", "--row-cost", "measured", "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)["meta"]
    assert meta["row_cost"] == pytest.approx(_lambda_of(meta["cost_model"]["fit"]))


def test_stream_rows_caps_only_the_streaming_variants(capsys):
    """--stream-rows is streaming's own N_pf (rows at once), so one run compares round-based PreSTO at N_pf requests
    per call with streaming at fewer rows: no window of the streaming chains ever holds more rows, the round-based
    row keeps --npf, and the chains stay identical; without a streaming traversal the flag is refused."""
    base = ["bench", "presto", "--model", "tiny", "--prompts", "2", "--n", "10", "--K", "8", "--npf", "8",
            "--no-cost-model", "--json"]
    assert main(base + ["--traversals", "bfs", "streaming", "--stream-rows", "2"]) == 0
    rows = {r["traversal"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["bfs"]["npf"] == 8 and rows["streaming"]["npf"] == 2
    assert rows["streaming"]["streaming"]["max_rows"] == 2
    assert all(r["identical_chains"] == 2 for r in rows.values())
    assert main(base + ["--traversals", "streaming"]) == 0  # without the flag on the embedded engine: min(N_pf, 6)
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["npf"] == min(8, CPU_STREAM_ROWS) and 2 < row["streaming"]["max_rows"] <= CPU_STREAM_ROWS
    assert main(base + ["--traversals", "bfs", "--stream-rows", "2"]) == 2
    assert "--stream-rows applies only to the streaming traversals" in capsys.readouterr().err


def test_default_stream_rows_caps_the_embedded_engine_only():
    """On the embedded engine (CPU) streaming runs at most CPU_STREAM_ROWS rows by default; on a server (rows nearly
    free) and for MultiTryMH (2M − 1 = 7 requests per transition) it keeps N_pf."""
    parse = build_parser().parse_args
    power, multitry = SamplerConfig(kind="power-mh"), SamplerConfig(kind="multitry-mh")
    assert default_stream_rows(parse(["bench", "presto"]), None, [power]) == CPU_STREAM_ROWS
    assert default_stream_rows(parse(["bench", "presto"]), 4, [power]) == 4
    assert default_stream_rows(parse(["bench", "presto", "--backend", "http://h:1"]), 20, [power]) == 20
    assert default_stream_rows(parse(["bench", "presto", "--samplers", "power-mh", "multitry-mh"]), None,
                               [power, multitry]) is None
    assert default_stream_rows(parse(["sample", "--prompt", "x", "--sampler", "multitry-mh"]), 21, [multitry]) == 21


def _lambda_of(fit):
    """b/a of the step-time fit (0 where a loaded machine fits a ≤ 0 or b < 0)."""
    return max(fit["b_s"], 0.0) / fit["a_s"] if fit["a_s"] > 0 else 0.0


def test_early_reject_is_on_for_streaming_and_can_be_switched_off(capsys):
    """Streaming rows report their early rejections (exact: identical chains either way); --no-early-reject decides
    every transition on its whole proposal (none, nothing skipped); the flag is refused without a streaming traversal."""
    base = ["bench", "presto", "--model", "tiny", "--prompts", "2", "--n", "16", "--K", "12", "--npf", "4",
            "--traversals", "streaming", "--no-cost-model", "--json"]
    runs = {}
    for flag in ([], ["--no-early-reject"]):
        assert main(base + flag) == 0
        out = json.loads(capsys.readouterr().out)
        (row,) = out["rows"]
        assert row["identical_chains"] == 2 and out["meta"]["early_reject"] is (not flag)
        runs[bool(flag)] = row["streaming"]
    assert runs[False]["early_rejections"] > 0 and runs[False]["early_rejection_tokens_skipped"] > 0
    assert runs[True]["early_rejections"] == 0 and runs[True]["early_rejection_tokens_skipped"] == 0
    assert main(["bench", "presto", "--model", "tiny", "--prompts", "1", "--traversals", "bfs",
                 "--no-early-reject"]) == 2
    assert "--early-reject/--no-early-reject applies only to the streaming traversals" in capsys.readouterr().err
