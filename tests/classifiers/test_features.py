"""Tests for scored-node records and classifier features."""

from __future__ import annotations

import json

import pytest

from forerun.classifiers.features import FEATURE_SETS, drop_unreachable, feature_matrix, feature_vector
from forerun.programs.acceptance import CLASSES, epsilon_class
from forerun.programs.records import RecordError, RecordWriter, parse_node_record, read_node_records
from forerun.testing.synthetic_records import synthetic_node_records


def write_node_records(path, records) -> int:
    return RecordWriter(path).write_nodes(records)


def _line(**over):
    base = dict(
        prompt_id="p0",
        call_index=0,
        node_id=1,
        depth=1,
        cut=17,
        parent_cut=40,
        cut_fraction=17 / 64,
        accepts_on_path=1,
        accept_prob=0.5,
        certainty_class="uncertain",
        realized=True,
    )
    base.update(over)
    return base


def test_epsilon_class_thresholds_inclusive():
    assert epsilon_class(0.0) == "reject"
    assert epsilon_class(0.01) == "reject"
    assert epsilon_class(0.0100001) == "uncertain"
    assert epsilon_class(0.99) == "accept"
    assert epsilon_class(0.5, epsilon=0.1) == "uncertain"
    with pytest.raises(ValueError, match="epsilon"):
        epsilon_class(0.5, epsilon=0.6)
    with pytest.raises(ValueError, match="accept_prob"):
        epsilon_class(1.2)


def test_read_roundtrip_and_blank_lines(tmp_path):
    recs = synthetic_node_records(n_prompts=2, calls_per_prompt=2, nodes_per_call=5, seed=1)
    path = tmp_path / "r.jsonl"
    assert write_node_records(path, recs) == len(recs)
    with path.open("a") as f:
        f.write("\n   \n")
    back = read_node_records(path)
    assert back == recs
    assert back[0].extra["loglik_mean"] == recs[0].extra["loglik_mean"]


def test_record_types_are_normalised():
    r = parse_node_record(_line(prompt_id=7, realized=1, depth=1.0))
    assert r.prompt_id == "7" and r.realized is True and r.depth == 1
    assert r.extra == {}
    r = parse_node_record(_line(extra_stat=3.5))
    assert r.extra == {"extra_stat": 3.5}


def test_relabel_with_epsilon():
    r = parse_node_record(_line(accept_prob=0.05, certainty_class="uncertain"), epsilon=0.1)
    assert r.certainty_class == "reject"
    obj = _line(accept_prob=0.995)
    del obj["certainty_class"]
    assert parse_node_record(obj, epsilon=0.01).certainty_class == "accept"


@pytest.mark.parametrize(
    "text, message",
    [
        ("{bad json", "not valid JSON"),
        (json.dumps([1, 2]), "JSON object"),
        (json.dumps({k: v for k, v in _line().items() if k != "cut"}), "missing field.*cut"),
        (json.dumps(_line(certainty_class="maybe")), "certainty_class"),
        (json.dumps(_line(cut_fraction=1.5)), "cut_fraction"),
        (json.dumps(_line(depth="two")), "depth"),
        (json.dumps(_line(accept_prob=None)), "accept_prob"),
        (json.dumps(_line(realized="yes")), "realized"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_line()) + "\n" + text + "\n")
    with pytest.raises(RecordError, match=rf"bad.jsonl:2: .*{message}"):
        read_node_records([path])


def test_missing_file_is_named(tmp_path):
    with pytest.raises(RecordError, match="nothere.jsonl"):
        read_node_records(tmp_path / "nothere.jsonl")


def test_features():
    r = parse_node_record(_line(loglik_first=-2.0))
    X = feature_matrix([r], FEATURE_SETS["1+2"] + ("loglik_first",))
    assert X.tolist() == [[17 / 64, 40, 23, 1, 1, -2.0]]
    with pytest.raises(ValueError, match="node 1.*'nope'"):
        feature_matrix([r], ("nope",))
    with pytest.raises(ValueError, match="numeric"):
        feature_vector(("flag",), {"flag": True})


def test_synthetic_records_follow_tree_conventions():
    recs = synthetic_node_records(n_prompts=3, calls_per_prompt=2, nodes_per_call=15, horizon=32, seed=0)
    assert {r.certainty_class for r in recs} == set(CLASSES)
    by_call: dict = {}
    for r in recs:
        by_call.setdefault((r.prompt_id, r.call_index), {})[(r.node_id - 1) // 2] = r
    for nodes in by_call.values():
        assert sorted(nodes) == list(range(15))
        for i, r in nodes.items():
            assert r.node_id == 2 * i + 1
            assert r.depth == (i + 1).bit_length() - 1
            assert r.cut <= r.parent_cut  # Condition 1
            assert r.cut_fraction == r.cut / 32
            if i:
                up = nodes[(i - 1) // 2]
                assert r.parent_cut == (up.cut if i % 2 == 1 else up.parent_cut)
                assert r.accepts_on_path == up.accepts_on_path + (i % 2)
    # accept_prob agrees with the label
    assert all(epsilon_class(r.accept_prob) == r.certainty_class for r in recs)
    # no signal -> cut fraction does not move the class mix much; with signal it does
    strong = synthetic_node_records(n_prompts=20, seed=1, signal=6.0)
    late = [r.certainty_class for r in strong if r.cut_fraction > 0.7]
    early = [r.certainty_class for r in strong if r.cut_fraction < 0.3]
    assert late.count("accept") / max(1, len(late)) > early.count("accept") / max(1, len(early))


def test_drop_unreachable_matches_bfs_unreachable_requests():
    from forerun.programs.prefetch_tree import accept_child, bfs_collect

    # BFS defers node 1 (cut 6 > κ(1) = 5) and expands 4 below it; the walk never reaches 4
    plan = bfs_collect([5, 6, 2], 10, 10, 3)
    recs = [parse_node_record(_line(node_id=accept_child(v), call_index=0)) for v in sorted(plan.expanded)]
    recs += [parse_node_record(_line(node_id=accept_child(4), call_index=1))]  # other call: no ancestors
    kept = drop_unreachable(recs)
    reachable = plan.expanded - plan.unreachable
    assert {(r.node_id - 1) // 2 for r in kept if r.call_index == 0} == set(reachable)
    assert all(r.call_index == 0 for r in kept)
    with pytest.raises(ValueError, match="acceptance child"):
        drop_unreachable([parse_node_record(_line(node_id=2))])


def test_reads_the_sampler_record_format(tmp_path):
    """The line format of programs/records.py (the writer's fields typed, -inf log acceptance accepted)."""
    line = _line(
        node_id=1, depth=0, sampler="presto-power-mh", block=1, transition=0, log_accept=float("-inf"),
        accept_prob=0.0, certainty_class="reject", accepted=None,
    )
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(line) + "\n")
    (r,) = read_node_records(path)
    assert r.sampler == "presto-power-mh" and r.log_accept == float("-inf") and r.extra == {}
    assert r.certainty_class == "reject"


def test_records_of_two_traversals_of_one_prompt_stay_apart():
    """One `bench presto` run records BFS's and the predictive rule's calls under the same prompt and call
    numbers; each record names its traversal, so the reachability filter and the ceiling's rounds see each
    traversal's trees alone (merged, a node unreachable in its own call was kept because the other traversal
    expanded its parent, and rounds mixed two trees)."""
    from forerun.classifiers.ceiling import recorded_rounds
    from forerun.classifiers.features import drop_unreachable
    from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
    from forerun.programs.sampler_factory import make_sampler
    from forerun.testing.logit_table_model import LogitTableModel

    model = LogitTableModel(4, seed=3)
    cfg = SamplerConfig(response_length=8, block_size=8, steps_per_block=12, seed=5)
    runs = {}
    for traversal in ("bfs", "predictive"):
        pf = PrefetchConfig(budget=5, traversal=traversal, branch_prob=lambda node: 0.2 + 0.6 * node.cut_fraction)
        res = make_sampler(model, cfg, presto=True, prefetch=pf).run([1, 2], prompt_id="p0")
        runs[traversal] = [n for call in res.calls for n in call.nodes]
        assert {n.traversal for n in runs[traversal]} == {traversal}
    both = runs["bfs"] + runs["predictive"]
    assert drop_unreachable(both) == drop_unreachable(runs["bfs"]) + drop_unreachable(runs["predictive"])
    assert len(recorded_rounds(both)) == len(recorded_rounds(runs["bfs"])) + len(recorded_rounds(runs["predictive"]))
