"""The roofline part of `forerun bench engine`: decode speed for 1, 6 and 20 rows against the memory-bandwidth
bound, measured in the same run.

A decode step must read every weight matrix once (the native kernels read each once for all rows) and every
row's KV; on a CPU that traffic is the floor of a step's time:

    bytes per step      = weight bytes + Σ_rows context_row × KV bytes per token
    bytes per token     = bytes per step / rows
    bound (tokens / s)  = rows × bandwidth / bytes per step
    fraction of bound   = measured tokens / s ÷ bound

The bandwidth is measured here, now: numpy's sum over 512 MB (one thread; two threads on the halves) and
the engine's own streaming read (`native` kernels' `stream_read`, 1 and 2 threads); the best of them is the
bound's bandwidth.  The rows decode `decode_tokens` tokens each at τ = 1/4 (PowerMH's proposal
temperature) from the same cached prompt with distinct seeds, so every step carries exactly `rows` rows.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..runtime_ext.engine import native
from ..runtime_ext.protocol import SamplingParams


@dataclass(frozen=True)
class RooflineConfig:
    """Settings of the roofline measurement."""

    rows: tuple[int, ...] = (1, 6, 20)
    """Batch sizes (decode rows per step)."""
    decode_tokens: int = 64
    """Tokens each row generates."""
    repeats: int = 3
    """Timed repetitions per batch size (median reported)."""
    bandwidth_mib: int = 512
    """Size of the bandwidth probe's buffer."""


def _best_seconds(fn: Any, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _numpy_two_threads(a: np.ndarray) -> None:
    halves = [a[: len(a) // 2], a[len(a) // 2 :]]
    threads = [threading.Thread(target=h.sum) for h in halves]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def measure_bandwidth(mib: int = 512, repeats: int = 5) -> dict[str, float]:
    """Read bandwidth in GB/s (1e9 bytes / s) by each probe, and the best of them ("best")."""
    a = np.ones(mib * 2**20 // 8)
    out = {"numpy_sum_1_thread": a.nbytes / _best_seconds(a.sum, repeats) / 1e9,
           "numpy_sum_2_threads": a.nbytes / _best_seconds(lambda: _numpy_two_threads(a), repeats) / 1e9}
    del a
    k = native.kernels()
    if k is not None:
        b = torch.ones(mib * 2**20 // 4)
        before = torch.get_num_threads()
        try:
            for n in (1, 2):
                torch.set_num_threads(n)
                out[f"stream_read_{n}_thread{'s' if n > 1 else ''}"] = b.numel() * 4 / _best_seconds(
                    lambda: k.stream_read(b), repeats) / 1e9
        finally:
            torch.set_num_threads(before)
    out["best"] = max(out.values())
    return out


def weight_bytes(engine: Any) -> int:
    """Bytes of weight matrices one decode step reads (the embedding lookup aside)."""
    lean = getattr(engine.plan, "lean", None)
    if lean is not None:
        return int(lean.weight_bytes)
    mats = {id(m.weight): m.weight for m in engine.model.modules() if isinstance(m, torch.nn.Linear)}
    return sum(w.numel() * w.element_size() for w in mats.values())


def kv_bytes_per_token(engine: Any) -> int:
    return engine.num_layers * 2 * engine.num_kv_heads * engine.head_dim * engine.kv_dtype.itemsize


def time_rows(engine: Any, prompt: Sequence[int], rows: int, tokens: int, repeats: int) -> float:
    """Median seconds per decode step of `rows` rows decoding `tokens` tokens from the cached `prompt`."""
    engine.generate(list(prompt), SamplingParams(max_new_tokens=1, seed=0, ignore_eos=True))  # cache the prompt
    times = []
    for rep in range(repeats + 1):
        reqs = [(list(prompt), SamplingParams(max_new_tokens=tokens, temperature=0.25, seed=1000 * rep + i,
                                              ignore_eos=True)) for i in range(rows)]
        t0 = time.perf_counter()
        engine.generate_batch(reqs)
        if rep > 0:
            times.append((time.perf_counter() - t0) / tokens)
    return statistics.median(times)


def run_roofline(engine: Any, prompt: Sequence[int], config: RooflineConfig = RooflineConfig()) -> dict[str, Any]:
    """Tokens/s, bytes per token and the fraction of the bandwidth bound for each batch size."""
    bw = measure_bandwidth(config.bandwidth_mib)
    w, kv = weight_bytes(engine), kv_bytes_per_token(engine)
    context = len(prompt) + config.decode_tokens / 2
    table = []
    for rows in config.rows:
        step = time_rows(engine, prompt, rows, config.decode_tokens, config.repeats)
        step_bytes = w + rows * context * kv
        bound = rows * bw["best"] * 1e9 / step_bytes
        table.append({"rows": rows, "step_s": step, "tokens_per_s": rows / step, "bytes_per_step": step_bytes,
                      "bytes_per_token": step_bytes / rows, "bound_tokens_per_s": bound,
                      "fraction_of_bound": rows / step / bound})
    by_rows = {r["rows"]: r for r in table}
    ratio = by_rows[max(by_rows)]["step_s"] / by_rows[min(by_rows)]["step_s"]
    bw_after = measure_bandwidth(config.bandwidth_mib)["best"]
    return {"bandwidth_gb_s": bw, "bandwidth_after_gb_s": bw_after, "weight_bytes": w, "kv_bytes_per_token": kv,
            "mean_context_tokens": context, "rows": table, "kernels": engine.plan.path,
            "batch_invariant": engine.batch_invariant, f"step_{max(by_rows)}_rows_over_{min(by_rows)}_row": ratio}


def roofline_goals(speedup_vs_generate: float, r: dict[str, Any]) -> dict[str, bool]:
    """Issue 14's goals: single stream >= 2x transformers generate and >= 70 % of the bound (float32);
    20 rows <= 2.5x one row per step."""
    one = next(row for row in r["rows"] if row["rows"] == 1)
    key = next(k for k in r if k.startswith("step_") and k.endswith("_row"))
    return {"decode_speedup>=2.0": speedup_vs_generate >= 2.0, "single_row_fraction_of_bound>=0.7":
            one["fraction_of_bound"] >= 0.7, f"{key}<=2.5": r[key] <= 2.5}


def format_roofline(r: dict[str, Any]) -> str:
    bw = r["bandwidth_gb_s"]
    probes = ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in bw.items() if k != "best")
    lines = [f"(e) memory bandwidth {bw['best']:.1f} GB/s (best of: {probes}; after the runs: "
             f"{r['bandwidth_after_gb_s']:.1f}); weights {r['weight_bytes'] / 1e6:.0f} MB per step, KV "
             f"{r['kv_bytes_per_token'] / 1024:.0f} KiB per context token; kernels {r['kernels']} "
             f"({'batch-invariant' if r['batch_invariant'] else 'NOT batch-invariant'})",
             f"    {'rows':>4} {'ms/step':>8} {'tokens/s':>9} {'MB/token':>9} {'bound tok/s':>11} {'of bound':>8}"]
    for row in r["rows"]:
        lines.append(f"    {row['rows']:>4} {row['step_s'] * 1e3:>8.1f} {row['tokens_per_s']:>9.1f} "
                     f"{row['bytes_per_token'] / 1e6:>9.1f} {row['bound_tokens_per_s']:>11.1f} "
                     f"{100 * row['fraction_of_bound']:>7.0f}%")
    key = next(k for k in r if k.startswith("step_") and k.endswith("_row"))
    lines.append(f"    one step of {r['rows'][-1]['rows']} rows costs {r[key]:.2f}x one row (goal <= 2.5x)")
    return "\n".join(lines)
