"""The embedded engine's streaming extension (issue 12): per-step progress, a child that starts from a running
row's tokens and shares its KV (no re-prefill), the same tokens as a request sent on its own; and streaming
PreSTO on the tiny engine gives the sequential chain."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from forerun.programs.proposals import ProgramProposalModel
from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
from forerun.programs.sampler_factory import make_sampler
from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
from forerun.runtime_ext.engine.models import load_model
from forerun.runtime_ext.protocol import EngineError, SamplingParams, StreamingEngine
from forerun.testing.chains import assert_same_chain
from forerun.testing.kv_memory import fed_tokens, held_outside_tree, held_tokens, running_rows, tree_storages


@pytest.fixture(scope="module", params=["float64", "float32"])
def engine(request):
    eng = EmbeddedEngine(load_model("tiny", dtype=request.param), EngineConfig(batch_window_ms=1.0))
    yield eng
    eng.close()


def params(n, seed):
    return SamplingParams(max_new_tokens=n, temperature=0.5, seed=seed, ignore_eos=True, return_logprob=True)


class Collector:
    """A listener: keeps every event; optionally starts a child once a row reached some tokens."""

    def __init__(self):
        self.events = []
        self.done = threading.Event()
        self.on_progress = None

    def __call__(self, events):
        self.events.extend(events)
        if self.on_progress is not None:
            self.on_progress(events)
        if any(e.finished for e in events) and all(e.finished for e in self.last_of_each().values()):
            self.done.set()

    def last_of_each(self):
        out = {}
        for e in self.events:
            out[e.rid] = e
        return out


def test_progress_events_and_the_output_match_generate(engine):
    assert isinstance(engine, StreamingEngine)
    ids = list(engine.tokenizer.encode("stream me"))
    listen = Collector()
    engine.submit_stream(ids, params(6, 11), rid="row-a", listener=listen)
    assert listen.done.wait(30)
    progress = [e for e in listen.events if e.rid == "row-a"]
    assert [len(e.output_ids) for e in progress] == [1, 2, 3, 4, 5, 6]  # one event per decode step
    final = progress[-1]
    assert final.finished and final.output is not None and not final.aborted
    alone = engine.generate(ids, params(6, 11))
    assert final.output.output_ids == alone.output_ids
    assert list(final.output.output_logp0) == list(alone.output_logp0)
    for e in progress:  # a running row's log q_τ and log p0 so far: the output's own floats (early rejection)
        n = len(e.output_ids)
        assert e.output_logq == alone.output_logq[:n] and e.output_logp0 == alone.output_logp0[:n]
    with pytest.raises(EngineError, match="must generate"):
        engine.submit_stream(ids, params(0, 1), rid="row-z", listener=listen)


def test_a_child_starts_inside_a_running_row_and_shares_its_kv(engine):
    """The child's prompt = the parent's prompt + its first 4 tokens, submitted while the parent decodes: its
    prefill is a cache hit of the whole prefix (the parent row's KV copied into the radix tree), the engine
    computes no prompt token, and the child's tokens are those of the same request sent alone later."""
    engine.flush_cache()
    ids = list(engine.tokenizer.encode("parent row"))
    listen = Collector()
    child_prompt = []

    def start_child(events):
        parent = [e for e in events if e.rid == "parent"]
        if parent and len(parent[-1].output_ids) == 4 and not child_prompt:
            child_prompt.extend(ids + list(parent[-1].output_ids))
            engine.submit_stream(child_prompt, params(6, 99), rid="child", listener=listen, share_from="parent")

    listen.on_progress = start_child
    before = engine.stats()
    engine.submit_stream(ids, params(10, 5), rid="parent", listener=listen)
    assert listen.done.wait(30)
    last = listen.last_of_each()
    assert set(last) == {"parent", "child"}
    after = engine.stats()
    child = last["child"].output
    assert child.meta_info["cached_tokens"] == len(child_prompt) - 1  # the whole prefix was shared
    assert after["stream_shared_tokens"] - before.get("stream_shared_tokens", 0) == 4
    assert after["prefill_tokens"] - before["prefill_tokens"] == len(ids) - 1  # the parent's prompt only
    # both ended at the same decode step: the child joined right after the parent's 4th token
    steps = [len(e.output_ids) for e in listen.events if e.rid == "parent"]
    assert steps == list(range(1, 11))
    engine.flush_cache()
    alone = engine.generate(child_prompt, params(6, 99))
    assert child.output_ids == alone.output_ids and list(child.output_logp0) == list(alone.output_logp0)


def test_abort_of_a_streamed_row_is_reported(engine):
    ids = list(engine.tokenizer.encode("abort"))
    listen = Collector()
    listen.on_progress = lambda events: [engine.abort(e.rid) for e in events if len(e.output_ids) == 2]
    engine.submit_stream(ids, params(20, 3), rid="gone", listener=listen)
    assert listen.done.wait(30)
    final = listen.last_of_each()["gone"]
    assert final.aborted and len(final.output_ids) <= 3


def test_an_aborted_row_resumes_exactly_from_its_cached_kv(engine):
    """Abort a streamed suffix request after 5 tokens: EngineStreams reports them with their per-token quantities,
    the engine keeps the row's KV in its prefix cache, and the continuation (prompt + those tokens, same seed, the
    rest of the length) prefills nothing but its last token and completes to exactly the uninterrupted suffix."""
    from forerun.programs.stream_proposals import EngineStreams
    from forerun.programs.suffixes import SuffixRequest

    engine.flush_cache()
    streams = EngineStreams(engine, require_entropy=True)
    prompt = tuple(engine.tokenizer.encode("resume"))
    whole = SuffixRequest(prompt, 12, 0.25, 4321)
    streams.start("first", whole)
    ids = ()
    while len(ids) < 5:
        for u in streams.updates().updates:
            ids = u.ids
    streams.abort("first")
    gone = []
    while not gone:
        gone = [u for u in streams.updates().updates if u.aborted]
    partial = gone[0].partial
    assert partial is not None and tuple(partial.ids) == gone[0].ids and 5 <= len(partial.ids) < 12
    before = engine.stats()
    rest = SuffixRequest(prompt + gone[0].ids, 12 - len(partial.ids), 0.25, 4321)
    streams.start("rest", rest)
    done = None
    while done is None:
        done = next((u.suffix for u in streams.updates().updates if u.suffix is not None), None)
    streams.pause()
    assert engine.stats()["prefill_tokens"] - before["prefill_tokens"] == 0  # prompt and partial were cached
    resumed = partial.then(done)
    engine.flush_cache()
    alone = EngineStreams(engine, require_entropy=True)
    alone.start("alone", whole)
    ref = None
    while ref is None:
        ref = next((u.suffix for u in alone.updates().updates if u.suffix is not None), None)
    alone.pause()
    for name in ("ids", "logq", "logp0", "entropy"):
        assert getattr(resumed, name).tolist() == getattr(ref, name).tolist(), name


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
def test_streaming_presto_on_the_tiny_engine_gives_the_sequential_chain(engine, kind):
    from forerun.runtime_ext.backends.embedded import EmbeddedBackend

    temps = (0.25, 0.5, 1.0) if kind == "multitry-mh" else ()
    pm = ProgramProposalModel(EmbeddedBackend(engine), tempered_temperatures=temps)
    prompt = engine.tokenizer.encode("wörld")
    for seed in range(2):
        cfg = SamplerConfig(kind=kind, response_length=9, block_size=3 if seed else 9, steps_per_block=5, seed=seed,
                            mtm_candidates=2)
        a = make_sampler(pm, cfg).run(prompt)
        for npf in (1, 6):
            b = make_sampler(pm, cfg, presto=True, prefetch=PrefetchConfig(budget=npf, streaming=True)).run(prompt)
            assert_same_chain(a, b, (seed, npf))
            assert list(a.state.logp0) == list(b.state.logp0)
            assert all(c.max_rows <= max(npf, 3) for c in b.mh_calls)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_default_model_streaming_chains_are_the_sequential_chains(dtype):
    """Issue 12 on the default model (batch-invariant native kernels): streaming PreSTO gives the sequential
    chain for all three samplers on one prompt, and for PowerMH on MATH500 prompts at n = B = 32, K = 10."""
    from forerun.programs.proposals import proposal_model_for
    from forerun.eval.datasets.loading import load_prompts
    from forerun.programs.prompts import chat_prompt_ids
    from forerun.runtime_ext.runtime import open_runtime

    with open_runtime("default", dtype) as runtime:
        assert runtime.engine.batch_invariant
        ids = chat_prompt_ids(runtime.tokenizer, "What is 7 times 8? Answer briefly.")
        jobs = [(kind, ids, SamplerConfig(kind=kind, response_length=16, block_size=8, steps_per_block=5, seed=10086))
                for kind in ("power-mh", "entropy-cut", "multitry-mh")]
        jobs += [("power-mh", chat_prompt_ids(runtime.tokenizer, p.messages()),
                  SamplerConfig(kind="power-mh", response_length=32, block_size=32, steps_per_block=10, seed=10086))
                 for p in load_prompts("math500", limit=2)]
        for kind, prompt, cfg in jobs:
            pm = proposal_model_for(runtime.backend, kind, cfg.mtm_temperatures)
            a = make_sampler(pm, cfg).run(prompt)
            runtime.engine.flush_cache()
            b = make_sampler(pm, cfg, presto=True, prefetch=PrefetchConfig(budget=20, streaming=True)).run(prompt)
            assert_same_chain(a, b, kind)
            assert list(a.state.logp0) == list(b.state.logp0)



def kv_holders(eng) -> Counter:
    """{token prefix: how many copies of its last token's KV are alive}: one per tree path prefix, plus each running
    row's prefix segments the tree does not hold and its own buffer columns, placed by the row's fed token ids (a
    prefix's KV is the same bits whoever holds it)."""
    holders, tree, stack = Counter(), tree_storages(eng), [(node, ()) for node in eng.radix.root.children.values()]
    while stack:
        node, above = stack.pop()
        path = above + node.key
        holders.update(path[:i] for i in range(len(above) + 1, len(path) + 1))
        stack.extend((child, path) for child in node.children.values())
    for r in running_rows(eng):
        fed, pos = (tuple(r.input_ids) + tuple(r.output_ids))[: fed_tokens(r)], 0
        for t in r.prefix:
            n = int(t.shape[3])
            if t.untyped_storage().data_ptr() not in tree:
                holders.update(fed[:i] for i in range(pos + 1, pos + n + 1))
            pos += n
        holders.update(fed[:i] for i in range(pos + 1, len(fed) + 1))  # its own columns
    return holders


class KVWatch:
    """After every decode step (from a row listener): the KV alive (`held_tokens`, from the storages) is the copies
    `kv_holders` places, and no token prefix has two copies but a child's whole prompt (GENERATE feeds the prompt's
    last token at the first step: a child computes that token's KV itself, beside the parent's or a sibling's);
    each row's reservation is what it holds outside the tree plus what it may still generate.  What differed."""

    def __init__(self, eng):
        self.eng, self.problems, self.child_prompts = eng, [], set()

    def __call__(self) -> None:
        eng, tree = self.eng, tree_storages(self.eng)
        step, holders = eng._counters["decode_steps"], kv_holders(eng)
        if held_tokens(eng) != sum(holders.values()):
            self.problems.append(f"step {step}: {held_tokens(eng)} tokens of KV, {sum(holders.values())} placed")
        twice = sorted(len(p) - 1 for p, n in holders.items() if n > 1 and p not in self.child_prompts)
        if twice:
            self.problems.append(f"step {step}: KV of positions {twice} held twice")
        for r in running_rows(eng):
            mine, more = held_outside_tree(r, tree), r.params.max_new_tokens - len(r.output_ids)
            if r.reserved != mine + more:
                self.problems.append(f"{r.rid}: reserved {r.reserved}, holds {mine} outside the tree, {more} to come")


def run_family(eng, parent_prompt, parent_new, children):
    """Stream a parent row and, once it has generated j tokens, each child (rid, j, seed, new): prompt = parent
    prompt + those j tokens, `new` tokens, share_from the parent.  Returns ({rid: output}, {rid: (prompt, params)},
    the KVWatch)."""
    listen, watch, asked = Collector(), KVWatch(eng), {"parent": (parent_prompt, params(parent_new, 5))}

    def start_children(events):
        watch()
        for e in events:
            for rid, j, seed, new in children:
                if e.rid == "parent" and len(e.output_ids) == j and rid not in asked:
                    asked[rid] = (parent_prompt + list(e.output_ids), params(new, seed))
                    watch.child_prompts.add(tuple(asked[rid][0]))
                    eng.submit_stream(*asked[rid], rid=rid, listener=listen, share_from="parent")

    listen.on_progress = start_children
    eng.submit_stream(*asked["parent"], rid="parent", listener=listen)
    deadline = time.monotonic() + 60

    def finished():
        last = listen.last_of_each()
        return set(last) == set(asked) and all(e.finished for e in last.values())

    while not finished() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert finished()
    last = listen.last_of_each()
    return {rid: e.output for rid, e in last.items()}, asked, watch


def assert_alone(outs, asked, dtype="float64"):
    """Each request's tokens and log p0 bits are those of the request run alone in a fresh engine."""
    with EmbeddedEngine(load_model("tiny", dtype=dtype), EngineConfig(batch_window_ms=0.0)) as fresh:
        for rid, (prompt, p) in asked.items():
            ref = fresh.generate(prompt, p)
            assert outs[rid].output_ids == ref.output_ids, rid
            assert list(outs[rid].output_logp0) == list(ref.output_logp0), rid


def native_engine(dtype="float64", **config):
    eng = EmbeddedEngine(load_model("tiny", dtype=dtype), EngineConfig(**{"batch_window_ms": 0.0, **config}))
    if not eng._normal.share_prefix:
        eng.close()
        pytest.skip("the transformers fallback copies every row's prefix into its own buffer")
    return eng


PARENT = [(5 * i) % 200 + 9 for i in range(60)]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_streamed_children_and_their_running_parent_hold_the_shared_kv_once(dtype):
    """A parent row decodes 40 tokens; as PreSTO streaming does, children start from its prompt + its first j tokens
    once it has them: two at j = 8 (the second reads what the first shared) and one at j = 20, the first two
    finishing before the parent, the last after it.  No KV is held twice (`KVWatch`: the parent reads what it
    shared from the tree), each row's reservation is what it holds outside the tree plus what it may still
    generate, and every row's bits equal its request run alone.  The parent kept its generated tokens in its own
    buffer beside the tree's copy the children read (8, then 20 tokens held twice, and charged twice) until it
    finished."""
    with native_engine(dtype) as eng:
        outs, asked, watch = run_family(eng, PARENT, 40, [("c8", 8, 101, 12), ("c8b", 8, 106, 12), ("c20", 20, 103, 30)])
        assert eng.stats()["stream_shared_tokens"] == 8 + 8 + 20
        assert not watch.problems, watch.problems[:4]
    # a child's first token differs from the parent's at that position (else their KV would coincide by chance)
    assert all(outs[rid].output_ids[0] != outs["parent"].output_ids[j] for rid, j in (("c8", 8), ("c8b", 8), ("c20", 20)))
    assert outs["c8"].output_ids[0] != outs["c8b"].output_ids[0]
    assert_alone(outs, asked, dtype)


def test_a_streamed_child_is_charged_only_what_it_adds_to_its_running_parent():
    """Budget 124: the parent (60-token prompt, 40 new) holds 99 tokens at most; a child from its prompt + first 20
    tokens reads 79 of them in place and adds its last prompt token and 24 more: 25.  It was charged the 20 parent
    tokens of its prompt as well (their KV went into the tree only at its prefill), so it waited for the parent to
    finish and shared nothing.  It runs beside the parent, shares the 20 tokens, and the KV alive stays within 124."""
    with native_engine(max_total_tokens=124) as eng:
        outs, asked, watch = run_family(eng, PARENT, 40, [("c20", 20, 103, 25)])
        assert eng.stats()["stream_shared_tokens"] == 20 and eng.stats()["max_batch_rows"] == 2
        assert eng.stats()["peak_kv_pool_tokens"] <= 124
        assert not watch.problems, watch.problems[:4]
    assert_alone(outs, asked)
