"""The roofline's sampling rule: a run counts only between two bandwidth probes that agree."""

from types import SimpleNamespace

import pytest
import torch

from forerun.eval.engine_bench import roofline as bench_roofline
from forerun.eval.engine_bench.roofline import RooflineConfig, _timed_between_probes
from forerun.runtime_ext.engine import native


class ScriptedProbes:
    """Bandwidth probes returning a fixed sequence of "best" values."""

    def __init__(self, values):
        self.values = list(values)

    def bandwidth(self):
        return {"best": self.values.pop(0)}


def fake_engine(path, kv_dtype, kernels):
    """An engine as far as the roofline's kernel questions see it: its forward path, KV dtype and kernels."""
    return SimpleNamespace(plan=SimpleNamespace(path=path, kv_dtype=kv_dtype, kernels=kernels))


def test_a_run_between_disagreeing_probes_is_repeated():
    runs = []
    probes = ScriptedProbes([40.0, 64.0, 40.0, 42.0])  # 40 -> 64: the VM moved during the run; 40 -> 42 agrees
    bw, seconds, reruns, stable = _timed_between_probes(probes, lambda: runs.append(1) or 0.5, RooflineConfig())
    assert (bw, seconds, reruns, stable) == (41.0, 0.5, 1, True) and len(runs) == 2


def test_the_last_attempt_is_kept_and_flagged_unstable():
    probes = ScriptedProbes([40.0, 64.0, 40.0, 64.0])
    out = _timed_between_probes(probes, lambda: 0.25, RooflineConfig(attempts=2))
    assert out == (52.0, 0.25, 1, False)


def test_tolerance_is_relative_to_the_lower_probe():
    # 10 % of 40 is 4: 40 -> 44 agrees, 40 -> 44.5 does not
    assert _timed_between_probes(ScriptedProbes([40.0, 44.0]), lambda: 1.0, RooflineConfig())[3]
    assert not _timed_between_probes(ScriptedProbes([40.0, 44.5]), lambda: 1.0, RooflineConfig(attempts=1))[3]


@pytest.mark.parametrize("bad", [dict(rows=()), dict(repeats=0), dict(stable_within=0.0), dict(attempts=0)])
def test_config_is_validated(bad):
    with pytest.raises(ValueError):
        RooflineConfig(**bad)


def test_the_reported_vector_isa_is_the_code_that_runs(monkeypatch):
    monkeypatch.setattr(bench_roofline.native, "isa", lambda: "avx2")
    vec = SimpleNamespace(vectorized=lambda: True)
    assert bench_roofline.kernel_isa(fake_engine("native", torch.float32, vec)) == "avx2"
    assert bench_roofline.kernel_isa(fake_engine("native", torch.float64, vec)) == "portable"  # float32-only vector code
    assert bench_roofline.kernel_isa(fake_engine("native", torch.float32, SimpleNamespace(vectorized=lambda: False))) == "portable"
    assert bench_roofline.kernel_isa(fake_engine("sdpa", torch.float32, None)) == "none"


def test_the_compute_ceiling_is_the_higher_fma_reading_before_and_after_the_runs(monkeypatch):
    readings = [50e9, 110e9]  # the first probe disturbed: half the machine's rate

    class FakeProbes:
        def __init__(self, mib):
            self.history = []

        def bandwidth(self):
            self.history.append({"best": 30.0, "numpy_sum_1_thread": 30.0})
            return self.history[-1]

        def fma_rate(self):
            return readings.pop(0)

    monkeypatch.setattr(bench_roofline, "Probes", FakeProbes)
    monkeypatch.setattr(bench_roofline, "time_rows", lambda *args: 0.02)
    monkeypatch.setattr(bench_roofline, "weight_bytes", lambda engine: 500_000_000)
    monkeypatch.setattr(bench_roofline, "weight_elements", lambda engine: 125_000_000)
    monkeypatch.setattr(bench_roofline, "kv_bytes_per_token", lambda engine: 1000)
    engine = SimpleNamespace(num_layers=2, head_dim=4, batch_invariant=True,
                             model=SimpleNamespace(config=SimpleNamespace(num_attention_heads=2)),
                             plan=SimpleNamespace(path="native", kv_dtype=torch.float32, kernels=None))
    r = bench_roofline.run_roofline(engine, [1, 2, 3], RooflineConfig(rows=(1, 20), repeats=1, decode_tokens=2))
    assert r["fma_per_s"] == 110e9 and r["fma_per_s_readings"] == [50e9, 110e9]
    twenty = next(row for row in r["rows"] if row["rows"] == 20)
    # the 3-token prompt is one shared segment read once per step; each row's own KV is decode_tokens / 2 = 1 token
    assert twenty["bytes_per_step"] == 500_000_000 + (3 + 20 * 1) * 1000
    assert twenty["fmas_per_step"] == 20 * (125_000_000 + 2 * 2 * 2 * 4 * (3 + 1))
    assert twenty["limit"] == "compute"  # 20 x 125e6 FMAs / 110e9 = 23 ms > 500 MB / 30 GB/s = 17 ms
    assert "110 GFMA/s (the higher of the readings before and after the runs: 50, 110)" in \
        bench_roofline.format_roofline(r)


def test_the_reported_row_tile_schedule_is_the_one_the_kernels_run():
    schedule = lambda kb, pt, ps: SimpleNamespace(row_tile_schedule=lambda: (kb, pt, ps))
    assert bench_roofline.row_tile_schedule(fake_engine("native", torch.float32, schedule(0, 1, 1))) == \
        {"kblock_bytes": 0, "prefetch_tiles": 1, "prefetch_streams": 1}
    assert bench_roofline.row_tile_schedule(fake_engine("native", torch.float32, schedule(16384, 4, 4))) == \
        {"kblock_bytes": 16384, "prefetch_tiles": 4, "prefetch_streams": 4}
    assert bench_roofline.row_tile_schedule(fake_engine("sdpa", torch.float32, schedule(0, 1, 4))) is None
    assert bench_roofline._schedule_text({"row_tile_schedule": {"kblock_bytes": 16384, "prefetch_tiles": 4,
                                                                "prefetch_streams": 4}}) == \
        "; row tiles: K blocks of 16 KiB, 4 prefetching (a call of one row tile: in 4 streams)"
    assert bench_roofline._schedule_text({"row_tile_schedule": {"kblock_bytes": 0, "prefetch_tiles": 1,
                                                                "prefetch_streams": 1}}) == \
        "; row tiles: no K blocks, 1 prefetching (a call of one row tile: in 1 stream)"
    assert bench_roofline._schedule_text({"row_tile_schedule": None}) == ""


def test_the_bandwidth_ceiling_is_the_best_probe_including_interleaved_streams():
    """Memory serves a thread reading 4 interleaved runs faster than one run; a ceiling taken from one-run reads
    only would flatter every memory-bound fraction, so the 4-stream reads are among the probes and `best` is the
    highest of them all."""
    if native.kernels() is None:
        pytest.skip("no native kernels")
    out = bench_roofline.Probes(mib=8).bandwidth(repeats=1)
    streamed = [k for k in out if k.startswith("stream_read_") and k.endswith("_4_streams")]
    assert "stream_read_1_thread_4_streams" in streamed and len(streamed) == len({1, torch.get_num_threads()})
    assert out["best"] == max(v for k, v in out.items() if k != "best")
