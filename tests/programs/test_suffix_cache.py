"""No work done twice: a PreSTO chain never generates a request it generated in an earlier round, and its
chain stays identical to the sequential one.  Repeats are counted from the toy engine's own call log."""

from __future__ import annotations

import numpy as np
import pytest

from forerun.programs.suffixes import Suffix, SuffixRequest
from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
from forerun.programs.sampler_factory import make_sampler
from forerun.programs.suffix_cache import SuffixCache
from forerun.testing.logit_table_model import LogitTableModel
from forerun.testing.chains import assert_same_chain

TEMPS = (0.25, 0.5, 1.0)


def repeats(model: LogitTableModel) -> tuple[int, int, int, int]:
    """(repeated requests, distinct requests, repeated tokens, tokens) over the model's calls, where a
    repeat is a request some earlier call already generated (calls of one chain only)."""
    seen: set[SuffixRequest] = set()
    rep = total = rep_tok = tok = 0
    for call in model.calls:
        for r in dict.fromkeys(call):
            total += 1
            tok += r.max_tokens
            if r in seen:
                rep += 1
                rep_tok += r.max_tokens
        seen.update(call)
    return rep, total, rep_tok, tok


def chain(kind, seed, *, presto, reuse=True, npf=20, unit="request"):
    model = LogitTableModel(4, seed=2, tempered_temperatures=TEMPS if kind == "multitry-mh" else ())
    cfg = SamplerConfig(kind=kind, response_length=12, block_size=6, steps_per_block=15, seed=seed, mtm_candidates=2)
    pf = PrefetchConfig(budget=npf, budget_unit=unit, reuse_suffixes=reuse)
    return model, make_sampler(model, cfg, presto=presto, prefetch=pf).run([1, 2, 3], prompt_id="p")


@pytest.mark.parametrize("unit", ["request", "node"])
@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
def test_reuse_removes_repeats_and_keeps_the_chain(kind, unit):
    without = with_reuse = 0
    reused = 0
    for seed in range(4):
        _, seq = chain(kind, seed, presto=False)
        m0, plain = chain(kind, seed, presto=True, reuse=False, unit=unit)
        m1, pre = chain(kind, seed, presto=True, unit=unit)
        for res in (plain, pre):
            assert_same_chain(seq, res, f"seed {seed}")
        without += repeats(m0)[0]
        with_reuse += repeats(m1)[0]
        reused += sum(c.reused_requests for c in pre.rounds)
        assert sum(c.generated_requests for c in pre.calls) == repeats(m1)[1]  # the records count what ran
    assert without > 0, "the toy should produce repeated requests across rounds without the cache"
    assert with_reuse == 0
    assert reused >= without  # every former repeat is now served from the cache (a cached request can be
    # reused by several rounds; the budget can also spend what reuse saves on new requests)


def test_reuse_can_serve_a_whole_round_without_a_model_call():
    rounds = 0
    for seed in range(12):
        _, pre = chain("entropy-cut", seed, presto=True)
        rounds += sum(1 for c in pre.calls if c.kind == "reuse")
        assert all(c.wall_time == 0 and c.generated_requests == 0 for c in pre.calls if c.kind == "reuse")
        assert pre.transitions == sum(c.transitions for c in pre.rounds) == 30
    assert rounds > 0


def _suffix(n: int) -> Suffix:
    z = np.zeros(n)
    return Suffix(np.zeros(n, dtype=np.int64), z, z, z)


def test_cache_is_bounded_and_pruned_by_transition():
    cache = SuffixCache(capacity=3)
    reqs = [SuffixRequest((1, t), 2, 0.5, t) for t in range(5)]
    for j, r in enumerate(reqs):
        cache.put(r, _suffix(2), transition=j)
    assert len(cache) == 3 and reqs[0] not in cache and reqs[4] in cache  # least recently used out
    assert cache.get(reqs[2]) is not None
    cache.put(SuffixRequest((9,), 1, 1.0, 1), _suffix(1), transition=9)
    assert reqs[2] in cache and reqs[3] not in cache  # reqs[2] was used more recently than reqs[3]
    cache.prune(5)
    assert reqs[2] not in cache and reqs[4] not in cache and len(cache) == 1
    assert cache.get(reqs[0]) is None
    with pytest.raises(ValueError, match="capacity"):
        SuffixCache(0)
