from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from forerun.testing.logit_table_model import LogitTableModel
from forerun.programs.acceptance import log_mh_ratio
from forerun.programs.cut_statistics import ENTROPY_FEATURES, LIKELIHOOD_FEATURES, RATIO_FEATURES, root_cut_features
from forerun.programs.records import RecordError, RecordWriter, read_node_records
from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
from forerun.programs.sampler_factory import make_sampler


def test_jsonl_is_append_only_and_round_trips(tmp_path):
    model = LogitTableModel(4, seed=2)
    cfg = SamplerConfig(response_length=6, block_size=6, steps_per_block=6, seed=1)
    res = make_sampler(model, cfg, presto=True, prefetch=PrefetchConfig(budget=5)).run([1, 2], prompt_id="p0")
    path = tmp_path / "r" / "nodes.jsonl"
    w = RecordWriter(path)
    n1 = w.write_calls(res.calls)
    n2 = w.write_calls(res.calls)
    assert n1 == n2 == sum(len(c.nodes) for c in res.calls)
    back = read_node_records(path)
    assert len(back) == 2 * n1 and back[:n1] == [n for c in res.calls for n in c.nodes]
    first = json.loads(path.read_text().splitlines()[0])
    assert first["prompt_id"] == "p0" and first["certainty_class"] in ("reject", "accept", "uncertain")
    assert res.calls[1].to_json(with_nodes=False).get("nodes") is None


def test_appending_after_a_torn_last_line_starts_a_new_line(tmp_path):
    """A records file cut mid-line (a kill or a full disk mid-write): the next run's lines are whole lines after it,
    not glued to the torn one (which lost the first new record too and made the next reader fail there)."""
    model = LogitTableModel(4, seed=2)
    cfg = SamplerConfig(response_length=6, block_size=6, steps_per_block=6, seed=1)
    res = make_sampler(model, cfg, presto=True, prefetch=PrefetchConfig(budget=5)).run([1, 2], prompt_id="p0")
    path = tmp_path / "nodes.jsonl"
    n = RecordWriter(path).write_calls(res.calls)
    with path.open("a") as fh:
        fh.write('{"prompt_id": "p0", "ca')  # torn
    RecordWriter(path).write_calls(res.calls)
    lines = path.read_text().splitlines()
    assert len(lines) == 2 * n + 1 and lines[n] == '{"prompt_id": "p0", "ca'
    whole = [json.loads(line) for i, line in enumerate(lines) if i != n]
    assert whole[n:] == whole[:n]  # every new record is whole


def _written(tmp_path, name="nodes.jsonl"):
    """A records file the writer wrote (one chain's calls), and its lines."""
    model = LogitTableModel(4, seed=2)
    cfg = SamplerConfig(response_length=6, block_size=6, steps_per_block=6, seed=1)
    res = make_sampler(model, cfg, presto=True, prefetch=PrefetchConfig(budget=5)).run([1, 2], prompt_id="p0")
    path = tmp_path / name
    RecordWriter(path).write_calls(res.calls)
    return path, res.calls, path.read_text().splitlines()


@pytest.mark.parametrize("cut", [1, 9, 30, -1])  # inside '{"prompt_id": ', just after it, one character short
def test_a_torn_last_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path, cut):
    """A kill or a full disk mid-append leaves the last line cut with no newline: the reader used to fail there
    (and `classifier cv/train/ceiling` with it) until the file was edited.  Skipped, as the run-file reader does,
    with one warning naming the file and line; the whole lines before it are read as written."""
    path, calls, lines = _written(tmp_path)
    with path.open("a") as fh:
        fh.write(lines[0][:cut])
    warned = []
    back = read_node_records(path, warn=warned.append)
    assert back == [n for c in calls for n in c.nodes]
    assert warned == [f"{path}:{len(lines) + 1}: skipped a torn line (a write cut short by a kill or a full disk)"]
    with pytest.warns(UserWarning, match=f"nodes.jsonl:{len(lines) + 1}: skipped a torn line"):
        assert read_node_records(path) == back  # without `warn`: a Python warning


@pytest.mark.parametrize("cut", [1, 9, 30, -1])
def test_a_torn_line_the_writer_appended_after_is_skipped_with_a_warning(tmp_path, cut):
    """The writer starts a new line after a torn one, so a later run's records follow it on lines of their own: the
    torn line, now in the middle and ended by that newline, is skipped too (it begins as every written line does)."""
    path, calls, lines = _written(tmp_path)
    with path.open("a") as fh:
        fh.write(lines[0][:cut])
    RecordWriter(path).write_calls(calls)
    warned = []
    back = read_node_records(path, warn=warned.append)
    assert back == 2 * [n for c in calls for n in c.nodes]
    assert len(warned) == 1 and warned[0].startswith(f"{path}:{len(lines) + 1}: skipped a torn line")


@pytest.mark.parametrize("bad", ["not json", '["prompt_id", 1', '{"sampler": "x", "prompt_id": "p0", '])
def test_a_bad_line_that_is_not_a_torn_one_stays_an_error(tmp_path, bad):
    """Only the writer's torn shapes are skipped: a line that is not JSON and neither the unterminated last line
    nor begins as a written line does (a line that does not begin with the writer's first key) is an error naming
    file and line, in the middle and as a last line that has its newline."""
    path, calls, lines = _written(tmp_path)
    last = tmp_path / "last.jsonl"
    last.write_text("".join(line + "\n" for line in [*lines, bad]))
    middle = tmp_path / "middle.jsonl"
    middle.write_text("".join(line + "\n" for line in [*lines[:2], bad, *lines[2:]]))
    for file, lineno in ((last, len(lines) + 1), (middle, 3)):
        with pytest.raises(RecordError, match=f"{file.name}:{lineno}: not valid JSON"):
            read_node_records(file, warn=pytest.fail)


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt_id": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_node_records(path)
    with pytest.raises(ValueError, match="directory"):
        RecordWriter(tmp_path)


def test_writer_stamps_the_model_and_the_reader_keeps_extra_fields(tmp_path):
    model = LogitTableModel(4, seed=2)
    cfg = SamplerConfig(response_length=6, block_size=6, steps_per_block=4, seed=1)
    res = make_sampler(model, cfg, presto=True, prefetch=PrefetchConfig(budget=3)).run([1, 2], prompt_id="p0")
    path = tmp_path / "nodes.jsonl"
    n = RecordWriter(path, model="SmolLM2-135M-Instruct").write_calls(res.calls)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == n and all(line["model"] == "SmolLM2-135M-Instruct" for line in lines)
    assert all(line["sampler"] == "presto-power-mh" for line in lines)
    back = read_node_records(path)
    features = set(LIKELIHOOD_FEATURES + ENTROPY_FEATURES + RATIO_FEATURES)
    assert all(r.model == "SmolLM2-135M-Instruct" and r.sampler == "presto-power-mh" and set(r.extra) == features
               for r in back)
    with path.open("a") as fh:
        fh.write(json.dumps({**lines[0], "loglik_mean": -1.5}) + "\n")
    assert read_node_records(path)[-1].extra == {**back[0].extra, "loglik_mean": -1.5}


def test_records_carry_features_3_and_4_of_the_root_state_at_the_cut():
    """Features 3/4 (App. E.7) are computed from the round's ROOT state before generation: a round's first
    decision has the root the sequential chain had before that transition, and the same cut."""
    model = LogitTableModel(4, seed=3)
    cfg = SamplerConfig(kind="entropy-cut", response_length=7, block_size=7, steps_per_block=9, seed=2)
    res = make_sampler(model, cfg, presto=True, prefetch=PrefetchConfig(budget=4)).run([1, 2], prompt_id="p")
    seq = make_sampler(model, cfg).run([1, 2], prompt_id="p")
    by_transition = {c.nodes[0].transition: c.nodes[0] for c in seq.mh_calls}
    for call in res.rounds:
        first = min(call.nodes, key=lambda n: n.depth)
        ref = by_transition[first.transition]
        assert first.cut == ref.cut and first.extra == pytest.approx(ref.extra)
        assert all(n.extra.keys() == ref.extra.keys() for n in call.nodes)
    x = res.state
    stats = root_cut_features(x, 2)
    assert stats["logq_at_cut"] == x.logq[2] and stats["logq_jump_in"] == pytest.approx(x.logq[2] - x.logq[1])
    assert stats["entropy_jump_out"] == pytest.approx(x.entropy[3] - x.entropy[2])
    assert stats["entropy_suffix_mean"] == pytest.approx(x.entropy[2:].mean())
    assert root_cut_features(x, 0)["entropy_jump_in"] == x.entropy[0]  # the jump from 0, as ΔH_0 = H_0
    assert root_cut_features(x, 6)["logq_jump_out"] == 0.0


def test_ratio_features_are_the_current_states_half_of_log_r():
    """logz_suffix_sum is Σ_{t≥c} (α log p0 − log q_τ) of the root state, so log r of any proposal y at cut c is
    y's own sum minus it (the oracle is `acceptance.log_mh_ratio` on the arrays); logz_suffix_expected is
    (T − c) × the state's mean per-token value.  Without α neither is computed."""
    model = LogitTableModel(5, seed=4)
    cfg = SamplerConfig(response_length=8, block_size=8, steps_per_block=6, seed=3)
    x = make_sampler(model, cfg).run([1, 2], prompt_id="x").state
    y = make_sampler(model, replace(cfg, seed=9)).run([1, 2], prompt_id="y").state
    alpha = cfg.alpha
    for cut in (0, 3, 7):
        fx, fy = root_cut_features(x, cut, alpha), root_cut_features(y, cut, alpha)
        manual = sum(alpha * x.logp0[t] - x.logq[t] for t in range(cut, 8))
        assert fx["logz_suffix_sum"] == pytest.approx(manual) and fx["logz_suffix_sum"] <= 1e-9
        assert fx["logz_suffix_expected"] == pytest.approx((8 - cut) * np.mean(alpha * x.logp0 - x.logq))
        y_spliced = np.concatenate([x.logq[:cut], y.logq[cut:]]), np.concatenate([x.logp0[:cut], y.logp0[cut:]])
        log_r = log_mh_ratio(x.logq, x.logp0, y_spliced[0], y_spliced[1], cut, alpha)
        assert log_r == pytest.approx(fy["logz_suffix_sum"] - fx["logz_suffix_sum"])
    assert not set(RATIO_FEATURES) & set(root_cut_features(x, 2))


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failed_write_names_the_file():
    """A write that fails (a full disk; /dev/full fails every write) is an OSError naming the records file, so the
    CLI's one line says which file (`bench presto --records /dev/full` said only 'No space left on device')."""
    import errno

    model = LogitTableModel(4, seed=2)
    cfg = SamplerConfig(response_length=6, block_size=6, steps_per_block=6, seed=1)
    res = make_sampler(model, cfg, presto=True, prefetch=PrefetchConfig(budget=5)).run([1, 2], prompt_id="p0")
    with pytest.raises(OSError) as caught:
        RecordWriter("/dev/full").write_calls(res.calls)
    assert caught.value.errno == errno.ENOSPC and "/dev/full" in str(caught.value)


def test_a_line_with_no_end_is_refused_after_a_bounded_read(tmp_path, monkeypatch):
    """/dev/zero, or a file with no newlines, is one error naming file and line, not read whole into memory."""
    import forerun.programs.records as records

    model = LogitTableModel(4, seed=2)
    cfg = SamplerConfig(response_length=6, block_size=6, steps_per_block=6, seed=1)
    res = make_sampler(model, cfg, presto=True, prefetch=PrefetchConfig(budget=5)).run([1, 2], prompt_id="p0")
    path = tmp_path / "nodes.jsonl"
    RecordWriter(path).write_calls(res.calls)
    n = len(read_node_records(path))
    with path.open("a") as fh:
        fh.write(" " * 5000)  # a last line of 5000 characters, no newline
    monkeypatch.setattr(records, "MAX_LINE_CHARS", 4096, raising=False)
    with pytest.raises(ValueError, match=rf"nodes.jsonl:{n + 1}: a line longer than"):
        read_node_records(path)
    monkeypatch.setattr(records, "MAX_LINE_CHARS", 1 << 20)
    assert len(read_node_records(path)) == n  # a blank last line, within the bound, is skipped as before
    with pytest.raises(ValueError, match="/dev/zero:1: a line longer than"):
        read_node_records("/dev/zero")


def test_a_deeply_nested_line_names_file_and_line(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ValueError, match="deep.jsonl:1: not a node record"):
        read_node_records(path)
