"""`forerun bench engine`: the embedded engine measured side by side in one run.

(a) single-stream decode tokens/s relative to transformers `generate` (greedy, same model, same prompt,
    same number of tokens, both including the prefill of the prompt);
(b) the time of ONE call generating `num_suffixes` suffixes of `suffix_tokens` tokens from as many cuts of
    one cached `root_tokens`-token root, divided by the time of one such suffix alone (PreSTO's batched
    prefetch call vs one proposal);
(c) the prefix-cache hit rate of that call (cached prompt tokens / reusable prompt tokens);
(d) the peak KV-pool use (radix tree + running rows), tokens and MiB;
(e) tokens/s for 1, 6 and 20 rows against the memory-bandwidth bound (`roofline`);
(f) the decode step with none, half or all of a batch's rows grammar-constrained (`constrained`).
Timings are medians over `repeats` runs after one warm-up.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from ...programs.prompts import chat_prompt_ids
from ...runtime_ext.engine import EngineConfig
from ...runtime_ext.engine.native import on_transient_thread
from ...runtime_ext.protocol import SamplingParams
from ...runtime_ext.runtime import open_runtime
from .constrained import format_constrained, measure_constrained
from .roofline import RooflineConfig, format_roofline, roofline_goals, run_roofline

BENCH_PROMPT = (
    "Explain, step by step, how a radix tree can be used to share the key-value cache of a language model "
    "between requests that start with the same tokens, and why this makes sampling many continuations cheap."
)


@dataclass(frozen=True)
class EngineBenchConfig:
    """Settings of `forerun bench engine` (defaults: the issue's measurement)."""

    model: str = "default"
    """Model spec (default | tiny | path)."""
    dtype: str | None = None
    """Model dtype (None: float32; tiny float64)."""
    root_tokens: int = 256
    """Length of the cached root the cuts are drawn from."""
    num_suffixes: int = 20
    """Suffixes generated in the one batched call (PreSTO's N_pf)."""
    suffix_tokens: int = 128
    """Tokens generated per suffix."""
    decode_tokens: int = 128
    """Tokens generated in the single-stream measurement."""
    constrained_batch_rows: int = 8
    """Rows of (f)'s batch (half of them constrained in its mixed variant)."""
    repeats: int = 3
    """Timed repetitions (median reported)."""
    seed: int = 0
    """Seed for the cuts and the sampling noise."""

    def __post_init__(self) -> None:
        for name in ("root_tokens", "num_suffixes", "suffix_tokens", "decode_tokens", "constrained_batch_rows",
                     "repeats"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if _cut_room(self.root_tokens) < self.num_suffixes + 1:
            need = _root_tokens_for(self.num_suffixes + 1)
            raise ValueError(f"root_tokens ({self.root_tokens}) too small for {self.num_suffixes + 1} distinct cuts "
                             f"after the root's prompt part: use at least {need}")


def _cut_room(root_tokens: int) -> int:
    """Distinct cut positions in the generated part of a root (its first quarter, at most, is the prompt)."""
    return root_tokens - max(1, root_tokens // 4) - 1


def _root_tokens_for(cuts: int) -> int:
    """The fewest root tokens with `cuts` distinct cut positions: a bisection (`_cut_room` never decreases), where a
    scan of every length up to 4 × cuts took hours for `--suffixes 100000000000000` before the model loaded."""
    low, high = 1, 4 * cuts + 16  # _cut_room(high) >= cuts
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if _cut_room(mid) < cuts else (low, mid)
    return low


def _hf_generate_seconds(loaded, ids: list[int], n: int) -> tuple[float, list[int]]:
    """transformers `generate` timed on a transient thread (native.on_transient_thread: on the main thread its
    OpenMP pool would slow every later engine step)."""
    def timed() -> tuple[float, list[int]]:
        x = torch.tensor([ids])
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = loaded.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                                        do_sample=False, use_cache=True, pad_token_id=loaded.eos_token_ids[0])
        return time.perf_counter() - t0, out[0, len(ids):].tolist()

    return on_transient_thread(timed)


def run_engine_bench(config: EngineBenchConfig = EngineBenchConfig(), *, progress: bool = True) -> dict[str, Any]:
    """Run (a)-(e) in one process; returns a JSON-able dict (ratios computed from the same run)."""
    runtime = open_runtime(config.model, config.dtype,
                           engine_config=EngineConfig(max_total_tokens=max(32768, 4 * config.root_tokens * config.num_suffixes)))
    loaded, engine = runtime.loaded, runtime.engine
    with runtime:
        prompt = chat_prompt_ids(loaded.tokenizer, BENCH_PROMPT)
        longest = len(prompt) + max(config.decode_tokens, config.root_tokens + config.suffix_tokens)
        if longest > loaded.max_context:
            raise ValueError(f"bench sizes exceed the model context: {longest} tokens (prompt {len(prompt)} + "
                             f"max(--decode-tokens, --root-tokens + --suffix-tokens)) > {loaded.max_context}")
        with tqdm(total=7 * (config.repeats + 1), desc="bench engine", disable=not progress, file=sys.stderr,
                  leave=False) as bar:
            decode = _measure_decode(loaded, engine, prompt, config, bar.update)
            fork = _measure_fork(loaded, engine, prompt, config, bar.update)
            constrained = measure_constrained(engine, prompt, config.constrained_batch_rows, config.decode_tokens,
                                              config.repeats, bar.update)  # (f)
        roofline = run_roofline(engine, prompt, RooflineConfig(decode_tokens=config.decode_tokens,
                                                               repeats=config.repeats))  # (e)
        st = engine.stats()
    return {
        "model": loaded.name,
        "dtype": str(loaded.dtype).replace("torch.", ""),
        "torch_threads": torch.get_num_threads(),
        "config": asdict(config),
        "decode": decode,
        "fork": fork,
        "roofline": roofline,
        "constrained": constrained,
        "goals": {
            **roofline_goals(decode["speedup_vs_transformers_generate"], roofline),
            "batched_over_single<=4": fork["batched_over_single"] <= 4.0,
            "prefix_hit_rate>=0.9": fork["prefix_hit_rate"] >= 0.9,
        },
        "engine_counters": {k: st[k] for k in ("decode_steps", "mean_batch_rows", "max_batch_rows", "rebuilds")},
    }


def _measure_decode(loaded: Any, engine: Any, prompt: list[int], config: EngineBenchConfig,
                    tick: Callable[[int], Any]) -> dict[str, Any]:
    """(a) single stream, both cold (prompt prefilled each time), one warm-up repetition first."""
    n = config.decode_tokens
    greedy = SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
    hf_times, eng_times = [], []
    same_tokens = None
    for rep in range(config.repeats + 1):
        t_hf, hf_ids = _hf_generate_seconds(loaded, prompt, n)
        tick(1)
        engine.flush_cache()
        t0 = time.perf_counter()
        out = engine.generate(prompt, greedy)
        t_eng = time.perf_counter() - t0
        tick(1)
        if rep > 0:
            hf_times.append(t_hf)
            eng_times.append(t_eng)
        same_tokens = list(out.output_ids) == hf_ids
    t_hf, t_eng = statistics.median(hf_times), statistics.median(eng_times)
    return {
        "prompt_tokens": len(prompt),
        "new_tokens": n,
        "transformers_generate_s": t_hf,
        "engine_s": t_eng,
        "transformers_tokens_per_s": n / t_hf,
        "engine_tokens_per_s": n / t_eng,
        "speedup_vs_transformers_generate": t_hf / t_eng,
        "greedy_tokens_identical": bool(same_tokens),
    }


def _measure_fork(loaded: Any, engine: Any, prompt: list[int], config: EngineBenchConfig,
                  tick: Callable[[int], Any]) -> dict[str, Any]:
    """(b)-(d): one cached root, cuts over its generated part; one warm-up repetition first."""
    engine.flush_cache()
    head = max(1, min(len(prompt), config.root_tokens // 4))
    root_out = engine.generate(prompt[:head], SamplingParams(max_new_tokens=config.root_tokens - head,
                                                             seed=config.seed, ignore_eos=True))
    root = list(root_out.input_ids) + list(root_out.output_ids)
    assert len(root) == config.root_tokens
    rng = np.random.default_rng(config.seed)
    lo = len(root_out.input_ids) + 1
    runs = []
    for rep in range(config.repeats + 1):
        cuts = sorted(rng.choice(np.arange(lo, len(root)), size=config.num_suffixes + 1, replace=False).tolist())
        run = _fork_repetition(engine, root, cuts, config, rep, tick)
        if rep > 0:
            runs.append(run)
        # forget the suffixes (keep the root) so every repetition starts from the same cache state
        engine.flush_cache()
        engine.generate(root[:-1], SamplingParams(max_new_tokens=1, seed=0, ignore_eos=True))
    bytes_per_token = engine.num_layers * 2 * engine.num_kv_heads * engine.head_dim * engine.kv_dtype.itemsize
    t_single = statistics.median(r["single_s"] for r in runs)
    t_batch = statistics.median(r["batch_s"] for r in runs)
    peak = max(r["pool_peak"] for r in runs)
    return {
        "root_tokens": config.root_tokens,
        "num_suffixes": config.num_suffixes,
        "suffix_tokens": config.suffix_tokens,
        "single_suffix_s": t_single,
        "batched_call_s": t_batch,
        "batched_over_single": t_batch / t_single,
        "prefix_hit_rate": float(np.mean([r["hit_rate"] for r in runs])),
        "peak_kv_pool_tokens": int(peak),
        "peak_kv_pool_mib": peak * bytes_per_token / 2**20,
        "kv_bytes_per_token": bytes_per_token,
    }


def _fork_repetition(engine: Any, root: list[int], cuts: list[int], config: EngineBenchConfig, rep: int,
                     tick: Callable[[int], Any]) -> dict[str, float]:
    """One suffix alone from the first cut, then the other cuts' suffixes in one batched call."""
    single_cut, batch_cuts = cuts[0], cuts[1:]

    def params(k: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=config.suffix_tokens, seed=config.seed * 1000 + rep * 100 + k,
                              ignore_eos=True, return_logprob=True)

    t0 = time.perf_counter()
    engine.generate(root[:single_cut], params(0))
    t_single = time.perf_counter() - t0
    tick(1)
    t0 = time.perf_counter()
    outs = engine.generate_batch([(root[:c], params(k + 1)) for k, c in enumerate(batch_cuts)])
    t_batch = time.perf_counter() - t0
    after = engine.stats()
    tick(1)
    cached = sum(o.meta_info["cached_tokens"] for o in outs)
    reusable = sum(o.meta_info["prompt_tokens"] - 1 for o in outs)
    return {"single_s": t_single, "batch_s": t_batch, "hit_rate": cached / reusable,
            "pool_peak": after["peak_kv_pool_tokens"]}


def format_engine_bench(r: dict[str, Any]) -> str:
    d, f = r["decode"], r["fork"]
    lines = [
        f"embedded engine bench — model {r['model']} ({r['dtype']}), torch threads {r['torch_threads']}",
        f"(a) single-stream decode ({d['new_tokens']} tokens after a {d['prompt_tokens']}-token prompt): "
        f"engine {d['engine_tokens_per_s']:.1f} tok/s vs transformers generate {d['transformers_tokens_per_s']:.1f} tok/s "
        f"-> {d['speedup_vs_transformers_generate']:.2f}x (goal >= 2.0x); greedy tokens identical: {d['greedy_tokens_identical']}",
        f"(b) {f['num_suffixes']} suffixes x {f['suffix_tokens']} tokens from cuts of a {f['root_tokens']}-token root in one call: "
        f"{f['batched_call_s']:.2f} s vs one suffix {f['single_suffix_s']:.2f} s -> {f['batched_over_single']:.2f}x (goal <= 4x)",
        f"(c) prefix hit rate of that call: {100 * f['prefix_hit_rate']:.1f}% (goal >= 90%)",
        f"(d) peak KV-pool use: {f['peak_kv_pool_tokens']} tokens = {f['peak_kv_pool_mib']:.1f} MiB",
        format_roofline(r["roofline"]),
        format_constrained(r["constrained"]),
    ]
    return "\n".join(lines)
