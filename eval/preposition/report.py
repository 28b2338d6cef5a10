"""The human-readable report of `forerun bench preposition` (`format_report(run_bench(...))`)."""

from __future__ import annotations

from typing import Any, Sequence


def _f(x: Any, spec: str = ".3f") -> str:
    """A number, or "-" where it is undefined (NaN, or null after a strict-JSON round trip)."""
    return "-" if x is None or x != x else format(x, spec)


def _ci(r: dict[str, Any]) -> str:
    lo, hi = r["ci95"]
    return f"{_f(r['rate'])} [{_f(lo)}, {_f(hi)}] ({r['k']}/{r['n']})"


def format_gate_point(p: dict[str, Any] | None) -> str:
    """One GatePoint (as a dict): coverage and false accept with their Wilson intervals."""
    if p is None:
        return "none"
    c, r = p["coverage_ci"], p["false_accept_ci"]
    return (f"τ={_f(p['threshold'])}: coverage {_f(p['coverage'])} [{_f(c[0])}, {_f(c[1])}], false accept "
            f"{_f(p['false_accept'])} [{_f(r[0])}, {_f(r[1])}] ({p['accepted']} accepted, {p['wrong']} wrong)")


def format_trend_gate(g: dict[str, Any]) -> list[str]:
    """The trend task's gate (`TrendReport.as_dict()`), each figure with the windows it was measured on."""
    c = g["calibration"]
    return [f"reference τ on all {g['n']} windows (fixed in advance, not picked on them): "
            f"{format_gate_point(g['at_tau'])}",
            f"τ for r ≤ {c['r_max']:g} picked on the {g['calibration_windows']} calibration windows: "
            f"{format_gate_point(c['calibrated'])}",
            f"held out ({g['held_out_windows']} other windows) at that τ, the estimate to read: "
            f"{format_gate_point(c['held_out_at_calibrated'])}"]


def _latency(res: dict[str, Any]) -> list[str]:
    m = res["microbench"]
    lines = [f"prefill τ_p = {m['prefill_ms_per_token']:.3f} ms/token (r² {m['prefill_r2']:.3f}), "
             f"T_decode = {m['decode_ms']:.2f} ms, entry L_entry = {res['entry_len']} tokens",
             f"{'arm':<12}{'P50 ms':>10}{'P99 ms':>10}{'mean ms':>10}{'n':>6}{'Δ':>6}"]
    for a, s in res["latency"].items():
        lines.append(f"{a:<12}{s['p50_ms']:>10.3f}{s['p99_ms']:>10.3f}{s['mean_ms']:>10.3f}{s['n']:>6}"
                     f"{s['mean_delta']:>6.1f}")
    r = res["ratios"]
    lines.append(f"L_cold / L_fast (P50) = {r['cold_over_fast_p50']:.1f}x (fast arm: gate forced open);  "
                 f"L_fall(Δ=0) / L_cold = {r['fall0_over_cold_p50']:.3f};  L_fall(Δ=L_entry) / L_cold = "
                 f"{r['fall_entry_over_cold_p50']:.3f}")
    lines.append(f"pre-position T_pp (off the critical path): P50 {res['preposition_ms']['p50_ms']:.2f} ms")
    cf = res["closed_form"]
    lines.append(f"closed form: L_cold {cf['l_cold_ms']:.2f}, L_fall(0) {cf['l_fall0_ms']:.2f}, "
                 f"L_fall(L) {cf['l_fall_entry_ms']:.2f}, L_fast {cf['l_fast_ms']:.3f} ms "
                 f"(T_restore residual {res['restore_residual_ms']:.2f} ms)")
    return lines


def _gates(res: dict[str, Any]) -> list[str]:
    lines = []
    if "gate" in res:
        g = res["gate"]
        lines.append(f"trend task (paper's, n={g['n']}, |A|={g['answer_set_size']}): agreement {g['agreement']:.3f}, "
                     f"full-path accuracy {g['full_accuracy']:.3f}; γ quantiles "
                     f"{[round(x, 3) for x in g['gap_quantiles']]}; cached tokens {g['fast_tokens']}")
        lines += ["  " + line for line in format_trend_gate(g)]
    if "status_gate" in res:
        sg = res["status_gate"]
        ex, rx = sg["exact"], sg["relaxed"]
        lines.append(f"status feed ({sg['windows']} calibration + {sg['windows']} held-out windows, query "
                     f"{sg['question']!r} + lead-in {sg['lead_in']!r}, |A|={sg['answer_set_size']}):")
        lines.append(f"  exact (standing query, risk vs ground truth): held-out accuracy "
                     f"{sg['held_out_accuracy_exact']:.3f}, γ quantiles {[round(x, 2) for x in sg['held_out_gap_quantiles_exact']]}")
        lines.append(f"    τ for r ≤ {ex['r_max']} picked on calibration: {format_gate_point(ex['calibrated'])}")
        lines.append(f"    held out at that τ: {format_gate_point(ex['held_out_at_calibrated'])}")
        lines.append(f"    held out at τ={ex['tau']:g}: {format_gate_point(ex['held_out_at_tau'])}")
        lines.append(f"  relaxed (generic header, Eq. 14 risk vs the full path; header accuracy "
                     f"{sg['held_out_accuracy_header']:.3f}): held out at τ={rx['tau']:g}: {format_gate_point(rx['held_out_at_tau'])}")
    return lines


def _traces(res: dict[str, Any]) -> list[str]:
    lines = []
    if "trace" in res:
        tr = res["trace"]
        g = "g not measured" if tr["gate_coverage_g"] is None else f"g = {_f(tr['gate_coverage_g'])}"
        lines.append(f"live trace, status feed, gate un-forced at τ = {_f(tr['tau'], 'g')} ({g}; "
                     f"mean update interval {tr['interval_s'] * 1e3:.0f} ms; ingest + T_pp {tr['update_cost_s'] * 1e3:.0f} ms):")
        for t in tr["points"]:
            cf_fast = t["closed_form_h_fast"]
            lines.append(f"  ρ={t['rho']:<5g} h {_f(t['measured_h'])} [{_f(t['h_ci95'][0])}, {_f(t['h_ci95'][1])}] "
                         f"vs ρ/(1+ρ) {t['closed_form_h']:.3f} (delayed {t['closed_form_h_delayed']:.3f}); "
                         f"h_fast {_ci(t['h_fast'])} vs g·h_delayed "
                         f"{_f(cf_fast)}; fast share of queries "
                         f"{_ci(t['fast_share_of_queries'])}, fast accuracy {_ci(t['fast_accuracy'])}; {t['paths']}")
    if "agentic" in res:
        ag = res["agentic"]
        p = {k: "-" if v is None else f"{v:.2f}" for k, v in ag["p50_ms"].items()}
        lines.append(f"agentic trace ({ag['turns']} tool calls, τ = {_f(ag['tau'], 'g')}, A = V): result pre-positioned "
                     f"{_ci(ag['predicted'])}; gate fired when pre-positioned {_ci(ag['gate_fired_when_predicted'])}; "
                     f"fast share {_ci(ag['fast_share'])}; first-token P50 ms fast {p['fast']}, fall (predicted) "
                     f"{p['fall_predicted']}, fall (delta-only) {p['fall_unpredicted']}; by tool {ag['by_tool']}")
    return lines


def _energy(res: dict[str, Any]) -> list[str]:
    e = res.get("energy")
    if not e:
        return []
    if not e.get("available"):
        return [f"energy per pre-position: unavailable — {e['reason']}"]
    if "joules_per_preposition" not in e:
        return [f"energy per pre-position: {e['source']} available, {e.get('skipped', 'not measured')}"]
    lines = [f"energy per pre-position ({e['source']}): {e['joules_per_preposition']:.3f} J marginal (idle "
             f"{e['idle_watts']:.1f} W, pre-position loop {e['loop_watts']:.1f} W, {e['iterations']} iterations)"]
    for w in e.get("wasted_vs_rho", []):
        lines.append(f"  ρ={w['rho']:<5g} wasted {w['measured']['joules_per_update'][0]:.3f} J/update = "
                     f"{w['measured']['watts'][0]:.3f} W (closed form {w['closed_form']['watts'][0]:.3f} W)")
    return lines


def format_report(res: dict[str, Any]) -> str:
    """Human-readable summary of `run_bench`'s result."""
    lines = _latency(res) + _gates(res) + _traces(res) + _energy(res)
    if res["gate_fire_probability_g"] is None:
        lines.append(f"E[L_pp] (Eq. 9): not computed, g {res['gate_fire_probability_g_source']}")
    else:
        lines.append("E[L_pp] (Eq. 9, g = %s: %s): %s ms" % (
            _f(res["gate_fire_probability_g"]), res["gate_fire_probability_g_source"],
            {k: round(v, 2) for k, v in res["expected_latency_ms"].items()}))
    return "\n".join(lines)


def top_counts(tokens: Sequence[str], k: int = 5) -> dict[str, int]:
    """The k most frequent token strings with their counts, most frequent first (ties: the string's order)."""
    counts: dict[str, int] = {}
    for t in tokens:
        counts[str(t)] = counts.get(str(t), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k])


def format_top_counts(counts: dict[str, int]) -> str:
    """`top_counts` as one line for reports: 'tok': n, ..."""
    return ", ".join(f"{t!r}: {n}" for t, n in counts.items())
