"""The roofline part of `forerun bench engine`: decode speed for 1, 6 and 20 rows against the machine's two
ceilings, both measured in the same run.

A decode step must read every weight matrix once (the native kernels read each once for all rows) and every
row's KV, and must do every row's multiply-adds; on a CPU the slower of the two is the floor of a step's time:

    bytes per step      = weight bytes + (shared + rows × own) × KV bytes per token
    FMAs per step       = rows × (weight elements + layers × 2 × heads × head_dim × (shared + own))
    floor (s / step)    = max(bytes / bandwidth, FMAs / FMA rate)
    fraction of floor   = floor ÷ measured seconds per step   (1 = at the hardware limit)

The bandwidth is probed right before AND right after every timed repetition (a shared VM's memory bandwidth
moves between ~35 and ~65 GB/s within seconds; a probe taken once compares a step with another moment's
machine): each probe is the best of numpy's sum over 512 MB (one thread; two threads on the halves) and the
kernels' `stream_read` over huge-page memory (1 and 2 threads, the memory the packed weights live in; each thread
reading its share in one run and in 4 interleaved runs, which memory serves faster: +7-10 % on a Zen 3 VM,
2026-12-07; before that day the bandwidth was the one-run reading, which flattered every memory-bound fraction).  A
repetition counts only when its two probes agree within `stable_within` (else it is re-run, up to `attempts`
times; the count of re-runs is reported), and its floor uses their mean.  The FMA rate is `fma_peak` on every thread,
read before and after all the runs; the higher reading is the ceiling (a reading half the other's was seen once on
a quiet VM: another process or the hypervisor had a core during that probe; both readings are reported).  The
rows decode `decode_tokens` tokens each at τ = 1/4 (PowerMH's proposal temperature) from the same cached prompt
with distinct seeds, so every step carries exactly `rows` rows.  Each fraction is the median over repetitions
of the per-repetition fraction.  `shared` is the prompt's tokens: every row attends to them, but they are one
cached KV segment read in place by all rows (`segment_table`), so memory supplies them once per step; `own` is
a row's mean generated tokens, decode_tokens / 2.  (Until 2026-12-04 the bytes counted the prompt once per
row, which raised the floor at 20 rows by ~10 % and flattered the fraction.)
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ...runtime_ext.engine import native
from ...runtime_ext.protocol import SamplingParams


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
    stable_within: float = 0.10
    """Largest relative difference between the probes before and after a repetition for it to count."""
    attempts: int = 4
    """Runs of a repetition at most, waiting for a stable bandwidth (the last one counts regardless, flagged)."""

    def __post_init__(self) -> None:
        if not self.rows or min(self.rows) < 1 or self.decode_tokens < 1 or self.repeats < 1:
            raise ValueError("roofline: rows, decode_tokens and repeats must be >= 1")
        if not 0 < self.stable_within or self.attempts < 1:
            raise ValueError("roofline: stable_within must be > 0 and attempts >= 1")


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


class Probes:
    """The bandwidth and compute probes, with their buffers allocated once.  Their torch and native work runs on
    transient threads (native.on_transient_thread): on the calling thread its OpenMP pool would slow the engine."""

    def __init__(self, mib: int = 512) -> None:
        self.array = np.ones(mib * 2**20 // 8)
        self.k = native.kernels()
        self.huge = native.on_transient_thread(lambda: self.k.huge_page_copy(torch.ones(mib * 2**20 // 4))) \
            if self.k is not None else None
        self.threads = torch.get_num_threads()
        self.history: list[dict[str, float]] = []

    def bandwidth(self, repeats: int = 3) -> dict[str, float]:
        """Read bandwidth in GB/s (1e9 bytes / s) by each probe, and the best of them ("best"); every result
        is also kept in `history`."""
        out = native.on_transient_thread(self._bandwidth, repeats)
        self.history.append(out)
        return out

    def _bandwidth(self, repeats: int) -> dict[str, float]:
        a = self.array
        out = {"numpy_sum_1_thread": a.nbytes / _best_seconds(a.sum, repeats) / 1e9,
               "numpy_sum_2_threads": a.nbytes / _best_seconds(lambda: _numpy_two_threads(a), repeats) / 1e9}
        if self.huge is not None:
            b = self.huge
            for n in sorted({1, self.threads}):
                for streams in (1, 4):
                    name = f"stream_read_{n}_thread{'s' if n > 1 else ''}" + (f"_{streams}_streams" if streams > 1 else "")
                    out[name] = b.numel() * 4 / native.with_threads(
                        n, lambda: _best_seconds(lambda: self.k.stream_read(b, streams), repeats)) / 1e9
        out["best"] = max(out.values())
        return out

    def fma_rate(self, iters: int = 2_000_000, repeats: int = 3) -> float | None:
        """float32 multiply-adds per second on all engine threads (None without the native kernels)."""
        if self.k is None:
            return None
        return self.threads * iters * 12 * 16 / native.on_transient_thread(
            _best_seconds, lambda: self.k.fma_peak(iters), repeats)


def weight_bytes(engine: Any) -> int:
    """Bytes of weight matrices one decode step reads (the embedding lookup aside)."""
    lean = getattr(engine.plan, "lean", None)
    if lean is not None:
        return int(lean.weight_bytes)
    return sum(w.numel() * w.element_size() for w in _linear_weights(engine))


def weight_elements(engine: Any) -> int:
    """Multiply-adds per row of one decode step's matrix products."""
    lean = getattr(engine.plan, "lean", None)
    if lean is not None:
        return int(lean.weight_elements)
    return sum(w.numel() for w in _linear_weights(engine))


def _linear_weights(engine: Any) -> list[torch.Tensor]:
    return list({id(m.weight): m.weight for m in engine.model.modules() if isinstance(m, torch.nn.Linear)}.values())


def kv_bytes_per_token(engine: Any) -> int:
    return engine.num_layers * 2 * engine.num_kv_heads * engine.head_dim * engine.kv_dtype.itemsize


def decode_rows(engine: Any, prompt: Sequence[int], rows: int, tokens: int, rep: int) -> tuple[float, list]:
    """(seconds per decode step, the outputs) of `rows` rows decoding `tokens` tokens from the cached `prompt`
    (seeds by `rep`)."""
    engine.generate(list(prompt), SamplingParams(max_new_tokens=1, seed=0, ignore_eos=True))  # cache the prompt
    reqs = [(list(prompt), SamplingParams(max_new_tokens=tokens, temperature=0.25, seed=1000 * rep + i,
                                          ignore_eos=True)) for i in range(rows)]
    t0 = time.perf_counter()
    outs = engine.generate_batch(reqs)
    return (time.perf_counter() - t0) / tokens, outs


def time_rows(engine: Any, prompt: Sequence[int], rows: int, tokens: int, rep: int) -> float:
    """Seconds per decode step of `rows` rows decoding `tokens` tokens from the cached `prompt` (seeds by `rep`)."""
    return decode_rows(engine, prompt, rows, tokens, rep)[0]


def _timed_between_probes(probes: Probes, run: Any, config: RooflineConfig) -> tuple[float, float, int, bool]:
    """(bandwidth, seconds, re-runs, stable): `run()` timed between two bandwidth probes that agree within
    config.stable_within (re-run up to config.attempts times); the bandwidth is the two probes' mean."""
    for attempt in range(config.attempts):
        before = probes.bandwidth()["best"]
        seconds = run()
        after = probes.bandwidth()["best"]
        stable = abs(after - before) <= config.stable_within * min(after, before)
        if stable or attempt == config.attempts - 1:
            return (before + after) / 2, seconds, attempt, stable
    raise AssertionError("unreachable")


def native_kernels(engine: Any) -> Any:
    """The native kernels the engine's forward runs, None on the transformers path."""
    return engine.plan.kernels if engine.plan.path == "native" else None


def kernel_isa(engine: Any) -> str:
    """The instruction set the native kernels run with here ("avx512", "avx2"), "portable" for their scalar code,
    "none" on the transformers path: a step's speed depends on it."""
    k = native_kernels(engine)
    if k is None:
        return "none"
    if engine.plan.kv_dtype == torch.float64:  # the vector code is float32 only
        return "portable"
    return native.isa() if k.vectorized() else "portable"


def row_tile_schedule(engine: Any) -> dict[str, int] | None:
    """How the native matrix products walk the weights for 3+ row tiles (chosen per CPU for speed; the bits never
    depend on it): K blocks of `kblock_bytes` (0: the whole K), `prefetch_tiles` tiles that prefetch the next
    block; a call with one row tile prefetches the next unit in `prefetch_streams` interleaved streams.  None on
    the transformers path."""
    k = native_kernels(engine)
    if k is None:
        return None
    kblock_bytes, prefetch_tiles, prefetch_streams = k.row_tile_schedule()
    return {"kblock_bytes": int(kblock_bytes), "prefetch_tiles": int(prefetch_tiles),
            "prefetch_streams": int(prefetch_streams)}


def run_roofline(engine: Any, prompt: Sequence[int], config: RooflineConfig = RooflineConfig()) -> dict[str, Any]:
    """Tokens/s, bytes and FMAs per step, and the fraction of the floor for each batch size (see module doc)."""
    probes = Probes(config.bandwidth_mib)
    fma_readings = [probes.fma_rate()]
    w, kv, elems = weight_bytes(engine), kv_bytes_per_token(engine), weight_elements(engine)
    attn_per_token = engine.num_layers * 2 * int(engine.model.config.num_attention_heads) * engine.head_dim
    shared, own = len(prompt), config.decode_tokens / 2
    samples: dict[int, list[tuple[float, float]]] = {r: [] for r in config.rows}
    reruns, unstable = 0, 0
    for rows in config.rows:
        time_rows(engine, prompt, rows, min(8, config.decode_tokens), 0)  # warm-up of this batch size
    for rep in range(1, config.repeats + 1):
        for rows in config.rows:
            bw, seconds, again, stable = _timed_between_probes(
                probes, lambda: time_rows(engine, prompt, rows, config.decode_tokens, rep), config)
            reruns, unstable = reruns + again, unstable + (not stable)
            samples[rows].append((bw, seconds))
    fma_readings.append(probes.fma_rate())
    fma_rate = max(fma_readings) if None not in fma_readings else None
    bandwidths = probes.history
    table = []
    for rows in config.rows:
        step_bytes = w + (shared + rows * own) * kv
        step_fmas = rows * (elems + attn_per_token * (shared + own))
        fractions, bounds = [], []
        for bw, step in samples[rows]:
            floor = max(step_bytes / (bw * 1e9), step_fmas / fma_rate if fma_rate else 0.0)
            fractions.append(floor / step)
            bounds.append(rows / floor)
        step = statistics.median(s for _, s in samples[rows])
        memory_s = step_bytes / (statistics.median(b for b, _ in samples[rows]) * 1e9)
        compute_s = step_fmas / fma_rate if fma_rate else 0.0
        table.append({"rows": rows, "step_s": step, "tokens_per_s": rows / step, "bytes_per_step": step_bytes,
                      "bytes_per_token": step_bytes / rows, "fmas_per_step": step_fmas,
                      "bandwidth_gb_s": statistics.median(b for b, _ in samples[rows]),
                      "limit": "compute" if compute_s > memory_s else "memory",
                      "bound_tokens_per_s": statistics.median(bounds),
                      "fraction_of_bound": statistics.median(fractions)})
    by_rows = {r["rows"]: r for r in table}
    lo, hi = min(by_rows), max(by_rows)
    ratio = by_rows[hi]["step_s"] / by_rows[lo]["step_s"]
    floor_ratio = by_rows[lo]["bound_tokens_per_s"] / by_rows[lo]["rows"] / (by_rows[hi]["bound_tokens_per_s"] / hi)
    best = [b["best"] for b in bandwidths]
    return {"bandwidth_gb_s": {"best": statistics.median(best), "min": min(best), "max": max(best),
                               "probes": {k: statistics.median(b[k] for b in bandwidths) for k in bandwidths[0]
                                          if k != "best"}},
            "fma_per_s": fma_rate, "fma_per_s_readings": fma_readings, "weight_bytes": w, "weight_elements": elems,
            "kv_bytes_per_token": kv, "mean_context_tokens": shared + own, "shared_context_tokens": shared,
            "rows": table, "kernels": engine.plan.path,
            "vector_isa": kernel_isa(engine), "row_tile_schedule": row_tile_schedule(engine),
            "batch_invariant": engine.batch_invariant, f"step_{hi}_rows_over_{lo}_row": ratio,
            "reruns_for_stable_bandwidth": reruns, "unstable_samples": unstable,
            f"floor_{hi}_rows_over_{lo}_row": floor_ratio}


def roofline_goals(speedup_vs_generate: float, r: dict[str, Any]) -> dict[str, bool]:
    """Issue 14's goals: single stream >= 2x transformers generate and >= 70 % of the bound (float32);
    20 rows <= 2.5x one row per step."""
    one = next(row for row in r["rows"] if row["rows"] == 1)
    key = next(k for k in r if k.startswith("step_") and k.endswith("_row"))
    return {"decode_speedup>=2.0": speedup_vs_generate >= 2.0, "single_row_fraction_of_bound>=0.7":
            one["fraction_of_bound"] >= 0.7, f"{key}<=2.5": r[key] <= 2.5}


def _schedule_text(r: dict[str, Any]) -> str:
    sched = r.get("row_tile_schedule")
    if sched is None:
        return ""
    blocks = f"K blocks of {sched['kblock_bytes'] // 1024} KiB" if sched["kblock_bytes"] else "no K blocks"
    streams = sched["prefetch_streams"]
    return (f"; row tiles: {blocks}, {sched['prefetch_tiles']} prefetching (a call of one row tile: in {streams} "
            f"stream{'s' * (streams > 1)})")


def format_roofline(r: dict[str, Any]) -> str:
    bw = r["bandwidth_gb_s"]
    probes = ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in bw["probes"].items())
    fma = (f"{r['fma_per_s'] / 1e9:.0f} GFMA/s (the higher of the readings before and after the runs: "
           f"{', '.join(f'{x / 1e9:.0f}' for x in r['fma_per_s_readings'])})" if r["fma_per_s"]
           else "unmeasured (no native kernels)")
    lines = [f"(e) memory bandwidth {bw['best']:.1f} GB/s (median of the probes around each run, range "
             f"{bw['min']:.1f}-{bw['max']:.1f}; medians: {probes}); float32 FMA rate {fma}",
             f"    probes before and after each run: {r['reruns_for_stable_bandwidth']} run(s) repeated because "
             f"they differed by more than the tolerance, {r['unstable_samples']} kept unstable",
             f"    weights {r['weight_bytes'] / 1e6:.0f} MB per step, KV {r['kv_bytes_per_token'] / 1024:.0f} KiB per "
             f"context token ({r['shared_context_tokens']} shared prompt tokens read once per step); kernels "
             f"{r['kernels']}, vector code {r['vector_isa']} "
             f"({'batch-invariant' if r['batch_invariant'] else 'NOT batch-invariant'}){_schedule_text(r)}",
             f"    {'rows':>4} {'ms/step':>8} {'tokens/s':>9} {'MB/token':>9} {'limit':>8} {'bound tok/s':>11} {'of bound':>8}"]
    for row in r["rows"]:
        lines.append(f"    {row['rows']:>4} {row['step_s'] * 1e3:>8.1f} {row['tokens_per_s']:>9.1f} "
                     f"{row['bytes_per_token'] / 1e6:>9.1f} {row['limit']:>8} {row['bound_tokens_per_s']:>11.1f} "
                     f"{100 * row['fraction_of_bound']:>7.0f}%")
    key = next(k for k in r if k.startswith("step_") and k.endswith("_row"))
    fkey = key.replace("step_", "floor_")
    lines.append(f"    one step of {r['rows'][-1]['rows']} rows costs {r[key]:.2f}x one row (goal <= 2.5x; at the "
                 f"two ceilings it would cost {r[fkey]:.2f}x)")
    return "\n".join(lines)
