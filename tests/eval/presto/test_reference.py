"""The reference loader of `bench_reference`: definitions read by name from a file, nothing else run."""

from __future__ import annotations

import pytest

from forerun.eval.presto.reference import ReferenceConfig, _NoEos, _reference_steps, fitted_step, load_reference

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


@pytest.mark.parametrize("source, message", [
    # a name from the module's other lines, read when the definitions run (was an internal error, exit 1)
    ("DEVICE = 'cpu'\nclass AutoregressiveSampler:\n    def __init__(self, model, tokenizer, device=DEVICE): pass\n"
     "def naive_temp(p, context, temp, seq_len): pass\n"
     "def mcmc_power_samp(p, context, temp, mcmc_steps, max_new_tokens, block_num=16): pass\n",
     "do not load on their own .NameError"),
    ("class AutoregressiveSampler:\n    raise SystemExit(0)\n"
     "def naive_temp(p, context, temp, seq_len): pass\n"
     "def mcmc_power_samp(p, context, temp, mcmc_steps, max_new_tokens, block_num=16): pass\n",
     "do not load on their own .SystemExit"),
    # other signatures: found before the model loads (was a TypeError inside the run, exit 1)
    ("class AutoregressiveSampler:\n    def __init__(self, model): pass\n"
     "def naive_temp(p, context, temp, seq_len): pass\n"
     "def mcmc_power_samp(p, context, temp, mcmc_steps, max_new_tokens, block_num=16): pass\n",
     "AutoregressiveSampler does not take"),
    ("class AutoregressiveSampler:\n    def __init__(self, model, tokenizer, device): pass\n"
     "def naive_temp(p, context, temp, seq_len): pass\n"
     "def mcmc_power_samp(p, context, temp, mcmc_steps, max_new_tokens): pass\n",
     "mcmc_power_samp does not take"),
    ("class naive_temp: pass\n"
     "def AutoregressiveSampler(model, tokenizer, device): pass\n"
     "def mcmc_power_samp(p, context, temp, mcmc_steps, max_new_tokens, block_num=16): pass\n",
     "naive_temp does not take"),
])
def test_an_incompatible_reference_is_a_value_error_before_any_model_loads(tmp_path, source, message):
    path = tmp_path / "power_samp_utils.py"
    path.write_text(source)
    with pytest.raises(ValueError, match=message):
        load_reference(path)


def test_the_command_reports_an_incompatible_reference_in_one_line(tmp_path, capsys):
    from forerun.cli.main import main

    path = tmp_path / "power_samp_utils.py"
    path.write_text("class AutoregressiveSampler:\n    x = undefined_name\n"
                    "def naive_temp(p, context, temp, seq_len): pass\n"
                    "def mcmc_power_samp(p, context, temp, mcmc_steps, max_new_tokens, block_num=16): pass\n")
    assert main(["bench", "reference", "--reference", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "internal error" not in err and "NameError" in err


def test_an_endless_reference_file_is_refused_after_a_bounded_read(tmp_path, monkeypatch):
    import forerun.eval.presto.reference as reference

    path = tmp_path / "power_samp_utils.py"
    path.write_text(FAKE + "#" * 4096 + "\n")
    monkeypatch.setattr(reference, "MAX_REFERENCE_BYTES", 2048, raising=False)
    with pytest.raises(ValueError, match="larger than"):
        load_reference(path)
    monkeypatch.setattr(reference, "MAX_REFERENCE_BYTES", 1 << 20)
    assert "mcmc_power_samp" in load_reference(path)
    with pytest.raises(ValueError, match="/dev/zero: larger than"):
        load_reference("/dev/zero")


class _Tok:
    eos_token_id = 2


@pytest.mark.parametrize("body, message", [
    ("    return p.model.no_such_method(context)\n", "its code failed while it ran .AttributeError"),
    ("    return context\n", None),  # runs, but mcmc_power_samp below never calls it
])
def test_a_reference_that_fails_or_never_steps_while_it_runs_is_a_value_error(tmp_path, body, message):
    """Its code failing inside the run names the file (not an internal error of forerun's), and a run without MH
    steps is refused (not a StatisticsError about an empty mean)."""
    source = ("class AutoregressiveSampler:\n    def __init__(self, model, tokenizer, device):\n"
              "        self.model = model\n"
              f"def naive_temp(p, context, temp, seq_len):\n{body}"
              "def mcmc_power_samp(p, context, temp, mcmc_steps, max_new_tokens, block_num=16):\n"
              + ("    return naive_temp(p, context, temp, len(context) + max_new_tokens)\n" if message else
                 "    return context\n"))
    path = tmp_path / "power_samp_utils.py"
    path.write_text(source)
    cfg = ReferenceConfig(reference=str(path), K=3, n=4)
    with pytest.raises(ValueError, match=message or "called naive_temp 0 time"):
        _reference_steps(load_reference(path), object(), _Tok(), [1, 2], cfg)
