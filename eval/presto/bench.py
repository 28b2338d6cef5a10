"""`forerun bench presto`: each sampler and its PreSTO variant on the same prompts, in ONE run.

Prints the columns of PreSTO's Table 7 (App. D.2): total model-call time, MH transitions per call (the mean
over prompts of K ÷ calls, and Table 2's K ÷ mean calls), time per call, the Eq. 20 speedup (ratio of mean
cumulative call times), the reduction in calls and the increase in time per call (ratios of means, speedup =
reduction / increase), the median per-prompt speedup, whether the sequential and PreSTO chains were identical
(same seed -> same tokens and accept/reject history), and what a PreSTO call costs (nodes scored, distinct
requests, requests and tokens generated per call).
Block-extension calls are identical in both variants and excluded from the call metrics.

Several PreSTO variants run side by side on the same prompts (`--traversals bfs predictive streaming`): the
sequential chains run once and each variant is one row against them.  A streaming variant's "calls" are its
windows (`programs.streaming_presto`), so its row reads the same way (transitions per window, Eq. 20 on the MH
phase), with the rows started / aborted, the wasted tokens and the rows per decode step added.  Every row also
carries its decode steps S and row-steps G per chain: with a measured per-step time t(r) ≈ a + b·r
(`cost_model.step_cost_curve`), the model-call time is predicted as a·S + b·G (`cost_model.cost_model_prediction`), and a ratio of S
alone is what the speedup becomes where extra rows are free (b → 0, a wide accelerator batch).

What speculation costs, per row (the PreSTO variant's chains, `programs.request_ledger`): `wasted_token_fraction`,
the MH-phase tokens the variant generated that no realized decision read ÷ the tokens it generated (pooled over
the prompts; the sequential sampler's is 0 by construction), `repeated_requests`, the generations of a
request (same prompt and prefix ids, length, τ, seed) that decode again a token the chain had already decoded
for it, and `resumed_requests`, the streamed requests that continued an aborted row after its tokens (none
decoded twice), both summed over the prompts.
`npf` is the budget the variant ran with (`PrefetchConfig.resolved`: the sampler's default when none was given).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ...programs.proposals import proposal_model_for
from ...programs.samplers import ChainResult
from ...programs.sampler_config import PrefetchConfig, SamplerConfig
from ...programs.sampler_factory import make_sampler
from .table7 import ChainTiming, finite_mean, ratio, table7_columns

@dataclass
class PairResult:
    """One sampler and one PreSTO variant over the same prompts."""

    sampler: str
    sequential: list[ChainResult] = field(default_factory=list)
    presto: list[ChainResult] = field(default_factory=list)
    unflushed: int = 0
    """Chains that started without a flushed prefix cache (asked to flush, the server stayed busy)."""
    traversal: str = "bfs"
    """The PreSTO variant: "bfs", "predictive", "streaming" (ranked by the chain's acceptance rate) or
    "streaming-predictive" (by the classifier's ĥ)."""
    npf: int | None = None
    """N_pf the PreSTO variant ran with."""

    def table_row(self) -> dict[str, Any]:
        """Table 7 (`table7.table7_columns`) plus what the benchmark adds: Table 2's K ÷ mean calls, what a PreSTO
        call costs, the accept rate, decode steps and row-steps (the cost model's S and G)."""
        seq, pre = self.sequential, self.presto
        pairs = [(ChainTiming.of_chain(s), ChainTiming.of_chain(p)) for s, p in zip(seq, pre)]
        mean = lambda runs, attr: finite_mean(getattr(r, attr) for r in runs)  # noqa: E731
        return {
            "sampler": self.sampler,
            "prompts": len(seq),
            **table7_columns(pairs),
            # Table 2 (App. E.2): K (transitions per chain) ÷ the mean number of calls over prompts
            "transitions_per_call_table2": [ratio(mean(seq, "transitions"), mean(seq, "num_calls")),
                                            ratio(mean(pre, "transitions"), mean(pre, "num_calls"))],
            # what a PreSTO call costs, per model call (means over prompts of per-chain totals ÷ calls)
            "presto_per_call": {name: finite_mean(ratio(r.total(name), r.num_calls) for r in pre)
                                for name in ("nodes_scored", "distinct_requests", "generated_requests",
                                             "generated_tokens")},
            "presto_reuse_rounds": finite_mean(len(r.rounds) - r.num_calls for r in pre),
            "unflushed_chains": self.unflushed,
            "accept_rate": finite_mean(np.mean(s.history) for s in seq if s.history),
            "traversal": self.traversal,
            "npf": self.npf,
            "wasted_token_fraction": wasted_token_fraction(pre),
            "repeated_requests": sum(r.repeated_requests for r in pre),
            "resumed_requests": sum(r.requests.resumed_requests for r in pre),
            "decode_steps": [finite_mean(_sum(r, "decode_steps") for r in runs) for runs in (seq, pre)],
            "row_steps": [finite_mean(_sum(r, "row_steps") for r in runs) for runs in (seq, pre)],
            **({"streaming": streaming_metrics(pre)} if self.traversal.startswith("streaming") else {}),
        }


def wasted_token_fraction(runs: Sequence[ChainResult]) -> float:
    """Σ wasted ÷ Σ generated MH-phase tokens over the chains (`programs.request_ledger`); NaN without chains."""
    generated = sum(r.requests.generated_tokens for r in runs)
    return sum(r.requests.wasted_tokens for r in runs) / generated if generated else (0.0 if runs else math.nan)


def _sum(run: ChainResult, name: str) -> int:
    return int(sum(getattr(c, name) for c in run.mh_calls))


def streaming_metrics(runs: Sequence[ChainResult]) -> dict[str, Any]:
    """Per-window figures of streaming chains: means over windows of all prompts, and each prompt's windows."""
    windows = [c for r in runs for c in r.mh_calls]
    mean = lambda name: float(np.mean([getattr(c, name) for c in windows]))  # noqa: E731
    steps = sum(c.decode_steps for c in windows)
    early = [n.extra for c in windows for n in c.nodes if n.extra.get("log_accept_is_bound")]
    return {
        "windows": len(windows),
        "transitions_per_window": mean("transitions"),
        "decode_steps_per_window": mean("decode_steps"),
        "rows_per_step": sum(c.row_steps for c in windows) / steps if steps else math.nan,
        "rows_started_per_window": mean("rows_started"),
        "rows_aborted_per_window": mean("rows_aborted"),
        "wasted_tokens_per_window": mean("wasted_tokens"),
        "wasted_token_share": (sum(c.wasted_tokens for c in windows) / max(sum(c.generated_tokens for c in windows), 1)),
        "max_rows": max((c.max_rows for c in windows), default=0),
        # rejections decided before the proposal was complete (`streaming_presto`, `PrefetchConfig.early_reject`)
        "early_rejections": len(early),
        "early_rejection_tokens_skipped": sum(e["proposal_tokens"] - e["early_rejection_read"] for e in early),
        "per_prompt": [[{"transitions": c.transitions, "decode_steps": c.decode_steps, "row_steps": c.row_steps,
                         "max_rows": c.max_rows, "rows_started": c.rows_started, "rows_aborted": c.rows_aborted,
                         "wasted_tokens": c.wasted_tokens, "wall_s": c.wall_time} for c in r.mh_calls] for r in runs],
    }


@dataclass(frozen=True)
class Chain:
    """One independent chain of the benchmark: a sampler config, sequential or a PreSTO variant, on one prompt."""

    cfg: SamplerConfig
    presto: bool
    prompt_id: str
    ids: tuple[int, ...]
    variant: str = "bfs"
    """The PreSTO variant's label (a key of the benchmark's prefetch configs); "" for sequential."""


def chains_of(prompts: Sequence[tuple[str, Sequence[int]]], configs: Sequence[SamplerConfig],
              variants: Sequence[str] = ("bfs",)) -> list[Chain]:
    """Every chain, in a fixed order: config, prompt, sequential then each PreSTO variant."""
    return [Chain(cfg, variant != "", pid, tuple(int(t) for t in ids), variant) for cfg in configs
            for pid, ids in prompts for variant in ("", *variants)]


def run_pairs(
    pool: Any,
    prompts: Sequence[tuple[str, Sequence[int]]],
    configs: Sequence[SamplerConfig],
    prefetch: PrefetchConfig | dict[str, PrefetchConfig],
    *,
    flush: bool = False,
    progress: Callable[[str], None] | None = None,
    on_result: Callable[[ChainResult], None] | None = None,
    on_transitions: Callable[[int], None] | None = None,
) -> list[PairResult]:
    """Run every config sequentially and with PreSTO on every prompt; the chains are independent and run
    concurrently over `pool` (`runtime_ext.pool.RuntimePool`: each chain keeps one runtime slot for its whole
    life).  `flush` clears the runtime's prefix cache before each chain so that neither variant reuses the
    other's KV (a busy shared server may decline; counted in `PairResult.unflushed`).  The callbacks run under
    one lock: `progress(label)` after each chain, `on_transitions(k)` after every k realized transitions.
    `prefetch` is one PreSTO variant's config, or several by label (one row per config and label, the sequential
    chains shared)."""
    variants = prefetch if isinstance(prefetch, dict) else {"streaming" if prefetch.streaming else prefetch.traversal:
                                                            prefetch}
    lock = threading.Lock()

    def locked(fn: Callable[..., None] | None) -> Callable[..., None] | None:
        if fn is None:
            return None

        def call(*a: Any) -> None:
            with lock:
                fn(*a)
        return call

    report, record, step = locked(progress), locked(on_result), locked(on_transitions)

    def one(runtime: Any, chain: Chain) -> tuple[ChainResult, bool]:
        flushed = bool(runtime.flush()) if flush else True
        model = proposal_model_for(runtime.backend, chain.cfg.kind, chain.cfg.mtm_temperatures)
        pf = variants[chain.variant] if chain.presto else PrefetchConfig()
        sampler = make_sampler(model, chain.cfg, presto=chain.presto, prefetch=pf)
        res = sampler.run(list(chain.ids), prompt_id=chain.prompt_id, progress=step)
        if record is not None:
            record(res)
        if report is not None:
            report(f"{res.sampler} {chain.prompt_id}")
        return res, flushed

    chains = chains_of(prompts, configs, list(variants))
    results = pool.map(one, chains)
    pairs: dict[tuple[int, str], PairResult] = {(id(cfg), v): PairResult(sampler=cfg.kind, traversal=v,
                                                                         npf=variants[v].resolved(cfg).budget)
                                                 for cfg in configs for v in variants}
    for chain, (res, flushed) in zip(chains, results):
        for v in (variants if not chain.presto else [chain.variant]):
            pair = pairs[(id(chain.cfg), v)]
            (pair.presto if chain.presto else pair.sequential).append(res)
            pair.unflushed += 0 if flushed else 1
    return list(pairs.values())


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Table 7 layout: sequential / PreSTO per cell, then the ratios."""
    head = (f"{'sampler':<12} {'variant':<20} {'total time (s)':>22} {'transitions/call':>18} {'K÷calls':>8} {'time/call (s)':>17} "
            f"{'speedup':>8} {'median':>7} {'calls÷':>7} {'t/call×':>8} {'identical':>10} {'nodes,req/call':>15} "
            f"{'N_pf':>5} {'waste,rep':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        tt, tpc, tc = r["total_time_s"], r["transitions_per_call"], r["time_per_call_s"]
        per_call = r["presto_per_call"]
        lines.append(
            f"{r['sampler']:<12} {r.get('traversal', 'bfs'):<20} {tt[0]:>9.2f}±{r['total_time_std_s'][0]:<4.2f}/{tt[1]:>6.2f} "
            f"{tpc[0]:>8.2f}/{tpc[1]:<9.2f} {r['transitions_per_call_table2'][1]:>8.2f} {tc[0]:>8.3f}/{tc[1]:<8.3f} "
            f"{r['speedup_eq20']:>7.2f}x {r['median_prompt_speedup']:>6.2f}x {r['reduction_in_calls']:>6.2f}x "
            f"{r['increase_in_time_per_call']:>7.2f}x {r['identical_chains']:>4}/{r['prompts']:<5} "
            f"{per_call['nodes_scored']:>7.1f},{per_call['generated_requests']:<7.1f} "
            f"{_cell(r.get('npf')):>5} {_percent(r.get('wasted_token_fraction')):>5},{_cell(r.get('repeated_requests')):<4}"
        )
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _percent(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{100 * value:.0f}%"


def timestamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
