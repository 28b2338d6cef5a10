"""The references' horizon (`SamplerConfig.stop_at_eos`): at the end of a block a chain whose state holds an EOS
is cut after the first one and stops growing; sequential and PreSTO (round-based and streaming) chains stay
identical; without it the chain is the fixed n tokens of Table 6."""

from __future__ import annotations

import numpy as np
import pytest

from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
from forerun.programs.sampler_factory import make_sampler
from forerun.testing.chains import assert_same_chain
from forerun.programs.streaming_presto import StreamingPrestoSampler
from forerun.testing.logit_table_model import LogitTableModel
from forerun.testing.stepped_streams import SteppedStreams

EOS = 2


def _run(kind, seed, stop, prefetch=None, n=12):
    model = LogitTableModel(5, seed=3, tempered_temperatures=(0.25, 0.5, 1.0) if kind == "multitry-mh" else ())
    cfg = SamplerConfig(kind=kind, response_length=n, block_size=3, steps_per_block=4, seed=seed, stop_at_eos=stop)
    if prefetch is not None and prefetch.streaming:
        return StreamingPrestoSampler(model, cfg, prefetch, streams=SteppedStreams(model)).run([1, 0, 3], prompt_id="p")
    return make_sampler(model, cfg, presto=prefetch is not None, prefetch=prefetch or PrefetchConfig()).run(
        [1, 0, 3], prompt_id="p")


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
def test_a_chain_ends_after_the_block_that_holds_an_eos(kind):
    ended = 0
    for seed in range(8):
        seq = _run(kind, seed, (EOS,))
        full = _run(kind, seed, ())
        assert len(full.response_ids) == 12 and not full.ended_at_eos
        ids = list(seq.response_ids)
        if seq.ended_at_eos:
            ended += 1
            assert ids.index(EOS) == len(ids) - 1  # cut right after the first EOS
            blocks = sum(1 for c in seq.calls if c.kind == "extend")
            assert len(ids) <= 3 * blocks  # no block was extended after the one whose state held the EOS
            # oracle: the fixed-horizon chain of just those blocks, cut after its first EOS
            short = list(_run(kind, seed, (), n=3 * blocks).response_ids)
            assert short[:short.index(EOS) + 1] == ids
        else:
            assert EOS not in ids and len(ids) == 12
        for pf in (PrefetchConfig(budget=6), PrefetchConfig(budget=6, streaming=True)):
            assert_same_chain(seq, _run(kind, seed, (EOS,), pf), f"seed {seed} {pf.streaming}")
    assert ended > 0


def test_stop_at_eos_ids_are_validated():
    with pytest.raises(ValueError, match="stop_at_eos"):
        SamplerConfig(stop_at_eos=(-1,))
    assert np.isin([EOS], np.asarray((EOS,))).all()
