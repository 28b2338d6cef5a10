"""PreSTO's Table 7 (App. D.2), the one definition: a sampler against its PreSTO variant over paired chains.

Both places that print Table 7 read it from here: `forerun bench presto` (chains it just ran) and the report
of `forerun eval` (records of a run file).  A pair is the same prompt and seed run sequentially and with PreSTO.

    column                      definition (means over pairs; [sequential, PreSTO] where two)
    total_time_s                mean cumulative model-call time of a chain (block extensions excluded)
    transitions_per_call        mean over chains of K ÷ calls
    time_per_call_s             mean over chains of call time ÷ calls
    calls                       mean model calls per chain
    speedup_eq20                Eq. 20: mean call time (sequential) ÷ mean call time (PreSTO)
    increase_in_time_per_call   mean time per call (PreSTO) ÷ (sequential)
    reduction_in_calls          speedup × increase (so speedup = reduction ÷ increase)
    median_prompt_speedup       median over pairs of the per-chain call-time ratio
    identical_chains            pairs whose response ids AND accept/reject histories are equal

Undefined ratios (a zero or missing denominator) are NaN, never an exception.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ...programs.samplers import ChainResult


@dataclass(frozen=True)
class ChainTiming:
    """What Table 7 reads of one chain."""

    call_time_s: float
    time_per_call_s: float
    transitions_per_call: float
    num_calls: float
    response_ids: tuple[int, ...]
    history: tuple[bool, ...]

    @classmethod
    def of_chain(cls, res: ChainResult) -> "ChainTiming":
        return cls(res.call_time, res.time_per_call, res.transitions_per_call, res.num_calls,
                   tuple(res.response_ids), tuple(bool(h) for h in res.history))

    @classmethod
    def of_record(cls, rec: Mapping[str, Any]) -> "ChainTiming":
        """An MH record of a `forerun eval` run file (`harness.methods`: the history is under extra)."""
        def num(key: str) -> float:
            v = rec.get(key)
            return math.nan if v is None else float(v)
        return cls(num("call_time_s"), num("time_per_call_s"), num("transitions_per_call"), num("num_calls"),
                   tuple(rec.get("response_ids") or ()), tuple(bool(h) for h in (rec.get("extra") or {}).get("history", ())))


def finite_mean(xs: Iterable[float]) -> float:
    """Mean of the finite values (NaN when there are none)."""
    vals = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return float(np.mean(vals)) if vals else math.nan


def finite_std(xs: Iterable[float]) -> float:
    """Population standard deviation of the finite values (NaN when there are none)."""
    vals = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return float(np.std(vals)) if vals else math.nan


def ratio(num: float, den: float) -> float:
    """num ÷ den, NaN when either is undefined or den is not positive."""
    return num / den if math.isfinite(num) and math.isfinite(den) and den > 0 else math.nan


def table7_columns(pairs: Sequence[tuple[ChainTiming, ChainTiming]]) -> dict[str, Any]:
    """The Table 7 columns of (sequential, PreSTO) chain pairs (see the module docstring)."""
    seq = [s for s, _ in pairs]
    pre = [p for _, p in pairs]

    def both(attr: str, stat=finite_mean) -> list[float]:
        return [stat(getattr(c, attr) for c in seq), stat(getattr(c, attr) for c in pre)]

    total, per_call = both("call_time_s"), both("time_per_call_s")
    speedup = ratio(total[0], total[1])
    increase = ratio(per_call[1], per_call[0])
    per_prompt = [ratio(s.call_time_s, p.call_time_s) for s, p in pairs]
    finite = [x for x in per_prompt if math.isfinite(x)]
    return {
        "pairs": len(pairs),
        "total_time_s": total,
        "total_time_std_s": both("call_time_s", finite_std),
        "transitions_per_call": both("transitions_per_call"),
        "transitions_per_call_std": both("transitions_per_call", finite_std),
        "time_per_call_s": per_call,
        "calls": both("num_calls"),
        "speedup_eq20": speedup,
        "increase_in_time_per_call": increase,
        "reduction_in_calls": speedup * increase,
        "median_prompt_speedup": float(statistics.median(finite)) if finite else math.nan,
        "per_prompt_speedup": per_prompt,
        "identical_chains": sum(s.response_ids == p.response_ids and s.history == p.history for s, p in pairs),
    }
