"""The reference loader of `bench_reference`: definitions read by name from a file, nothing else run."""

from __future__ import annotations

import pytest

from forerun.eval.presto.reference import _NoEos, fitted_step, load_reference

FAKE = '''
import module_that_does_not_exist
from constants import *

class AutoregressiveSampler:
    def __init__(self, model, tokenizer, device):
        self.model, self.tokenizer, self.device = model, tokenizer, device

def naive_temp(p, context, temp, seq_len):
    return context + [0] * (seq_len - len(context)), [], []

def mcmc_power_samp(p, context, temp, mcmc_steps, max_new_tokens, block_num=16):
    print("ignored")
    return naive_temp(p, context, temp, len(context) + max_new_tokens)[0]

raise RuntimeError("module-level code never runs")
'''


def test_load_reference_takes_the_three_definitions_only(tmp_path):
    path = tmp_path / "power_samp_utils.py"
    path.write_text(FAKE)
    ns = load_reference(path)
    sampler = ns["AutoregressiveSampler"](None, _NoEos(object()), "cpu")
    assert sampler.tokenizer.eos_token_id is None
    assert ns["mcmc_power_samp"](sampler, [1, 2], 0.25, 3, 4) == [1, 2, 0, 0, 0, 0]
    (tmp_path / "other.py").write_text("def naive_temp(): pass\n")
    with pytest.raises(ValueError, match="mcmc_power_samp"):
        load_reference(tmp_path / "other.py")


def test_fitted_step_reads_the_least_squares_line():
    steps = [(0.1 + 0.01 * n, n) for n in (1, 10, 30, 64)]
    assert fitted_step(steps, 32.5) == pytest.approx(0.1 + 0.325)
