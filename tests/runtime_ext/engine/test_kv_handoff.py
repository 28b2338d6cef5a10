"""The KV budget counts each token the engine holds once, whoever holds it (the radix tree, a running row, a
reservation for tokens not generated yet), and the engine never holds more than its budget in real tensors.

Oracle of the memory, independent of the engine's counters: the KV tensors alive, read from the tensors
themselves (`forerun.testing.kv_memory`: the distinct storages behind the tree's nodes, each running row's prefix
segments the tree does not hold, its own buffer columns), plus what each row may still generate (its
max_new_tokens less the tokens it has).  Oracle of the outputs: each request run alone in a fresh engine
(the bits of its tokens and log p0)."""

from __future__ import annotations

import threading

import pytest

from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
from forerun.runtime_ext.engine.models import load_model
from forerun.runtime_ext.protocol import SamplingParams
from forerun.testing.kv_memory import held_outside_tree, held_tokens, running_rows, tree_storages


def to_come(r) -> int:
    return r.params.max_new_tokens - len(r.output_ids)


def watch(eng, check) -> list[str]:
    """Run check() after every admission and every decode step (on the engine's thread); the list of what failed."""
    step, admit = eng._step, eng._admit
    failures: list[str] = []

    def checked() -> None:
        try:
            check()
        except AssertionError as exc:
            failures.append(f"step {eng._counters['decode_steps']}: {exc}")

    def watched_step(batch):
        step(batch)
        checked()

    def watched_admit():
        admit()
        checked()

    eng._step, eng._admit = watched_step, watched_admit
    return failures


def alone(requests):
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0)) as eng:
        return [bits(eng.generate(ids, p)) for ids, p in requests]


def bits(out):
    return list(out.output_ids), list(out.output_logp0)


def native_engine(**config) -> EmbeddedEngine:
    eng = EmbeddedEngine(load_model("tiny"), EngineConfig(**{"batch_window_ms": 0.0, **config}))
    if not eng._normal.share_prefix:
        eng.close()
        pytest.skip("the transformers fallback copies the prompt into the row: the tree's copy is a second one")
    return eng


PROMPT_A = [(3 * i) % 240 + 5 for i in range(150)]
PROMPT_B = [(5 * i) % 240 + 7 for i in range(100)]


def test_a_row_that_fits_beside_a_decoding_row_joins_it():
    """Budget 400: A (150-token prompt, 100 new) holds at most 249 tokens, B (100-token prompt, 30 new) 129: 378
    fit together.  A's prompt was charged twice once A had prefilled (149 in the tree + its 249-token reservation
    = 398), so B waited for A to finish.  B joins A's batch, finishes first, and the KV alive never exceeds 400."""
    a = (PROMPT_A, SamplingParams(max_new_tokens=100, seed=1, ignore_eos=True))
    b = (PROMPT_B, SamplingParams(max_new_tokens=30, seed=2, ignore_eos=True))
    peaks = []
    with native_engine(max_total_tokens=400) as eng:
        watch(eng, lambda: peaks.append(held_tokens(eng)))
        box, order = {}, []

        def run_a():
            box["a"] = eng.generate(*a)
            order.append("a")

        t = threading.Thread(target=run_a)
        t.start()
        while eng.stats()["decode_steps"] < 2:
            pass
        box["b"] = eng.generate(*b)
        order.append("b")
        t.join(60)
        assert eng.stats()["max_batch_rows"] == 2 and order == ["b", "a"]
        assert eng.stats()["radix_skipped_tokens"] == 0  # the tree took every token it was offered
    assert max(peaks) <= 400 and max(peaks) > 249
    assert [bits(box["a"]), bits(box["b"])] == alone([a, b])


def test_each_rows_reservation_is_what_it_holds_outside_the_tree_plus_what_it_may_still_generate():
    """Rows of a shared cached prefix, of prompts of their own, and of one uncached prompt admitted together (the
    first computes it, the others find it whole in the tree at their prefill): at every admission and step each
    row's reservation equals the KV it holds outside the tree (real tensors) plus the tokens it may still generate,
    the tree's count is its real tensors, and the two stay within the budget."""
    budget = 700
    shared = [(7 * i) % 230 + 11 for i in range(120)]
    uncached = [(13 * i) % 210 + 17 for i in range(80)]  # the first of its rows computes it, the others read it
    requests = ([(shared + [k, k + 1], SamplingParams(max_new_tokens=20 + 7 * k, seed=k, ignore_eos=True))
                 for k in range(3)]
                + [([(11 * i + k) % 200 + 20 for i in range(40 + 10 * k)],
                    SamplingParams(max_new_tokens=25, seed=10 + k, ignore_eos=True)) for k in range(3)]
                + [(uncached + [k], SamplingParams(max_new_tokens=15, seed=20 + k, ignore_eos=True)) for k in range(3)])
    seen = []
    with native_engine(max_total_tokens=budget, batch_window_ms=20.0) as eng:
        eng.next_token_logits(shared)  # cached, unlocked

        def check():
            tree = tree_storages(eng)
            assert eng.radix.total_tokens == sum(tree.values())
            for r in running_rows(eng):
                held, more = held_outside_tree(r, tree), to_come(r)
                assert r.reserved == held + more, f"{r.rid}: reserved {r.reserved}, holds {held}, {more} to come"
            assert eng.radix.total_tokens + eng.radix.reserved <= budget
            assert held_tokens(eng) + sum(to_come(r) for r in running_rows(eng)) <= budget
            seen.append(len(running_rows(eng)))

        failures = watch(eng, check)
        outs = eng.generate_batch(requests)
        assert not failures, failures[:3]
        assert max(seen) >= 4
    assert [bits(o) for o in outs] == alone(requests)
