"""A decoding row's prompt KV is held once: rows read the radix tree's own tensors in place, not a second copy.

Oracle of the memory: the distinct storages (by address) behind the tree's nodes and the running rows' prefix
segments, counted in tokens, against the tokens the tree holds.  Oracle of the outputs: a plain transformers
forward of each whole sequence (log p0 of every generated token) and each request run alone in a fresh engine."""

from __future__ import annotations

import pytest
import torch

from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
from forerun.runtime_ext.engine.models import load_model
from forerun.runtime_ext.engine.requests import RequestMode
from forerun.runtime_ext.protocol import SamplingParams
from forerun.testing.transformers_oracle import norms_in_model_dtype

TOL = 1e-10
PROMPT = [(7 * i) % 250 + 1 for i in range(300)]


def held_tokens(eng, joining=()) -> int:
    """Tokens of KV behind every tree node, every running row's prefix segment and the segments of rows `joining`
    the batch, each storage counted once."""
    storages: dict[int, int] = {}

    def note(t: torch.Tensor) -> None:
        per_token = t[:, :, :, :1].numel() * t.element_size()
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() // per_token

    stack = list(eng.radix.root.children.values())
    while stack:
        node = stack.pop()
        note(node.kv)
        stack.extend(node.children.values())
    for batch in (eng._normal, eng._background):
        for r in batch.rows:
            for t in r.prefix:
                note(t)
    for _, segments in joining:
        for t in segments:
            note(t)
    return sum(storages.values())


def check_against_oracle(eng, out) -> None:
    seq = list(out.input_ids) + list(out.output_ids)
    with torch.inference_mode(), norms_in_model_dtype():
        logp = torch.log_softmax(eng.model(input_ids=torch.tensor([seq])).logits[0].double(), -1)
    n = len(out.input_ids)
    assert out.output_logp0 == pytest.approx([float(logp[n - 1 + t, y]) for t, y in enumerate(out.output_ids)],
                                             abs=TOL)


def alone(requests):
    """Each request run by itself in a fresh engine: (tokens, log p0 of each), which batching must not change a bit."""
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0)) as eng:
        return [bits(eng.generate(ids, p)) for ids, p in requests]


def bits(out):
    return list(out.output_ids), list(out.output_logp0)


def watch_steps(eng, also=None):
    """Record (held_tokens, the tree's tokens) as rows join the batch, with the segments they bring, and at every
    decode step's forward, as it reads them (running `also(step_index)` before each step)."""
    seen: list[tuple[int, int]] = []
    step, join, forward = eng._step, eng._normal.join, eng._forward
    stepping, steps = [], [0]

    def watched_step(batch):
        if also is not None:
            also(steps[0])
        steps[0] += 1
        stepping.append(True)
        try:
            step(batch)
        finally:
            stepping.clear()

    def watched_join(add):
        if add:
            seen.append((held_tokens(eng, add), eng.radix.total_tokens))
        join(add)

    def watched_forward(buf, length, input_ids, *args, **kwargs):
        if stepping:
            seen.append((held_tokens(eng), eng.radix.total_tokens))
        return forward(buf, length, input_ids, *args, **kwargs)

    eng._step, eng._normal.join, eng._forward = watched_step, watched_join, watched_forward
    return seen


def test_rows_decoding_after_a_prompt_their_batch_prefilled_hold_it_once():
    """Four rows of one uncached 300-token prompt: the first prefills it, the other three hit the tree.  The first
    row read its prefill's own buffer while the tree held a clone: 600 tokens of KV for a 300-token prompt."""
    requests = [(PROMPT + [k], SamplingParams(max_new_tokens=6, seed=k, ignore_eos=True)) for k in range(4)]
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=50.0)) as eng:
        if not eng._normal.share_prefix:
            pytest.skip("rows copy their prefix without the native forward")
        seen = watch_steps(eng)
        outs = eng.generate_batch(requests)
        assert sorted(o.meta_info["cached_tokens"] for o in outs) == [0, 300, 300, 300]
        assert seen and all(held == tree for held, tree in seen), seen
        assert seen[0][1] == 300
        assert eng.stats()["peak_kv_pool_tokens"] == 300 + 4 * 6
        for out in outs:
            check_against_oracle(eng, out)
    assert [bits(o) for o in outs] == alone(requests)


def test_a_row_reading_a_node_that_a_later_request_splits_holds_its_prompt_once():
    """Row A decodes after its 300-token prompt; B (its first 150 tokens, then others) arrives meanwhile and splits
    A's node in two new tensors.  A kept reading the old one: its prompt held twice until it finished."""
    a = (PROMPT + [9], SamplingParams(max_new_tokens=12, seed=3, ignore_eos=True))
    b = (PROMPT[:150] + [200 + i % 40 for i in range(20)], SamplingParams(max_new_tokens=4, seed=4, ignore_eos=True))
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0)) as eng:
        if not eng._normal.share_prefix:
            pytest.skip("rows copy their prefix without the native forward")
        late = []

        def submit_b(step_index):
            if step_index == 2:
                late.append(eng._make_request(b[0], b[1], rid="b", priority=0, mode=RequestMode.GENERATE))
                eng._submit(late)

        seen = watch_steps(eng, submit_b)
        out_a = eng.generate(*a)
        out_b = eng._wait(late[0])
        assert out_b.meta_info["cached_tokens"] == 150
        assert len(seen) > 4 and all(held == tree for held, tree in seen), seen
        for out in (out_a, out_b):
            check_against_oracle(eng, out)
    assert [bits(out_a), bits(out_b)] == alone([a, b])


def test_a_rows_prompt_goes_whole_into_the_tree_and_is_held_once():
    """A 400-token budget, a 300-token prompt and 6 new tokens: the row holds 306 tokens at most, so the tree takes
    the whole prompt (paid from the row's reservation) and the row reads it in place: 300 tokens held.  The prompt
    used to be charged twice, in the row's 306-token reservation and again in the tree, so the tree took only 94
    of its 300 tokens (400 - 306) and the row kept the other 206 itself."""
    request = (PROMPT + [5], SamplingParams(max_new_tokens=6, seed=5, ignore_eos=True))
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0, max_total_tokens=400)) as eng:
        if not eng._normal.share_prefix:
            pytest.skip("rows copy their prefix without the native forward")
        seen = watch_steps(eng)
        out = eng.generate(*request)
        assert seen[0] == (300, 300) and seen[1] == (300, 300), seen  # (held, the tree's tokens)
        assert eng.stats()["radix_skipped_tokens"] == 0
        check_against_oracle(eng, out)
    assert [bits(out)] == alone([request])


def test_rows_re_read_their_tree_path_only_after_a_split_or_a_join(monkeypatch):
    """track_tree walks each row's path to the root: once after the rows join and once after a split, not at every
    decode step (a deep PreSTO tree made that a per-step cost on the critical path)."""
    from forerun.runtime_ext.engine import batch as batch_module

    walks = []
    real = batch_module.tree_prefix
    monkeypatch.setattr(batch_module, "tree_prefix", lambda r: walks.append(r.rid) or real(r))
    requests = [(PROMPT + [k], SamplingParams(max_new_tokens=20, seed=k, ignore_eos=True)) for k in range(3)]
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=50.0)) as eng:
        if not eng._normal.share_prefix:
            pytest.skip("rows copy their prefix without the native forward")
        outs = eng.generate_batch(requests)
        assert eng.stats()["decode_steps"] >= 19
        assert len(walks) <= 2 * len(requests), len(walks)  # not 3 rows x 20 steps
    assert [bits(o) for o in outs] == alone(requests)
