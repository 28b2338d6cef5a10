"""assert_same_chain is the oracle of every "identical chain" test: it must catch a last-bit difference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from forerun.programs.sampler_config import SamplerConfig
from forerun.programs.sampler_factory import make_sampler
from forerun.testing.chains import assert_same_chain
from forerun.testing.logit_table_model import LogitTableModel


def chain(seed: int = 0):
    cfg = SamplerConfig(kind="entropy-cut", response_length=6, block_size=3, steps_per_block=4, seed=seed)
    return make_sampler(LogitTableModel(5, seed=3), cfg).run((1, 2))


def test_a_chain_equals_its_rerun():
    assert_same_chain(chain(), chain())


@pytest.mark.parametrize("name", ["logq", "logp0", "entropy"])
def test_one_ulp_in_the_final_state_is_a_different_chain(name):
    a, b = chain(), chain()
    values = np.array(getattr(b.state, name), dtype=np.float64)
    values[-1] = np.nextafter(values[-1], np.inf)
    b = dataclasses.replace(b, state=dataclasses.replace(b.state, **{name: values}))
    with pytest.raises(AssertionError, match=f"final {name} differs"):
        assert_same_chain(a, b)


def test_a_flipped_decision_is_a_different_chain():
    a, b = chain(), chain()
    b.history[0] = not b.history[0]
    with pytest.raises(AssertionError, match="histories differ"):
        assert_same_chain(a, b)
