"""`forerun bench scaleout`: PreSTO chains over 1, 2 and 4 SGLang workers, through the SGLang Model Gateway.

For each worker count N the benchmark launches N stand-in SGLang workers (`forerun.runtime_ext.standin.server`,
the JSON of SGLang 0.5.23 with a tiny deterministic model; `--step-ms` of sleep per decode step stands in for a GPU
step, and each worker serves one /generate at a time, a worker at capacity), puts the real `smg` binary in front
of them (`runtime_ext.launch`: sticky routing, one key -> one worker) and runs the `bench presto` chains
(each sampler sequential and PreSTO on the first MATH500 prompts) through the gateway's one URL with N chains in
flight.  Without `--gateway` the chains go to the N worker URLs directly (the client's own pool, one chain per
worker), the path used before the gateway.

    column            meaning
    chains_per_s      chains ÷ wall time of the N-worker run
    speedup           chains_per_s ÷ the 1-worker row's
    sticky_fraction   per chain: calls served by its main worker ÷ its calls; averaged over chains (read from the
                      workers' per-routing-key counters, a route of the stand-in: real servers have none)
    identical         every chain (tokens and accept/reject history) equal to the same chain run on one server
                      with no gateway
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ...programs.prompts import chat_prompt_ids
from ...programs.sampler_config import CPU_SAMPLER, PrefetchConfig, SamplerConfig
from ...runtime_ext import launch as launcher
from ...runtime_ext.protocol import EngineError
from ..datasets.loading import load_prompts

STANDIN_SERVER = "forerun.runtime_ext.standin.server"
MAX_WORKERS = 64
"""The most stand-in workers of one launch: each is a Python process, on consecutive ports (100000 overflowed the
port range after the first launch, an internal error)."""


@dataclass(frozen=True)
class ScaleoutConfig:
    """One `bench scaleout` run."""

    workers: tuple[int, ...] = (1, 2, 4)
    gateway: bool = True
    """Through the SGLang Model Gateway (`smg`), else the worker URLs given to the client directly."""
    prompts: int = 8
    """First MATH500 prompts; chains = samplers × prompts × 2 (sequential and PreSTO): 16, so that the unequal
    lengths of sequential and PreSTO chains even out over 4 workers."""
    n: int = 16
    K: int = 8
    npf: int = 4
    samplers: tuple[str, ...] = ("power-mh",)
    step_ms: float = 20.0
    """Sleep of a stand-in worker per decode step (a GPU step)."""
    port: int = 0
    """First port (0: a free one per launch)."""
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not self.workers or min(self.workers) < 1 or max(self.workers) > MAX_WORKERS:
            raise ValueError(f"--workers: each count must be in [1, {MAX_WORKERS}] (a worker is a process on its own "
                             f"port), got {' '.join(map(str, self.workers))}")
        for name in ("prompts", "n", "K", "npf"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.step_ms < 0:
            raise ValueError(f"step_ms must be >= 0, got {self.step_ms}")

    def sampler_configs(self) -> list[SamplerConfig]:
        return [SamplerConfig(kind=k, response_length=self.n, block_size=self.n, steps_per_block=self.K,
                              alpha=CPU_SAMPLER.alpha, seed=CPU_SAMPLER.seed) for k in self.samplers]


def _free_block(count: int, tries: int = 50) -> int:
    """A port P with P .. P + count - 1 all free: the launcher puts the gateway and the workers on consecutive
    ports, and a neighbour of one free port can be taken (bench scaleout has no --port to pick another)."""
    for _ in range(tries):
        port = launcher.free_port()
        if all(launcher.port_is_free("127.0.0.1", port + i) for i in range(count)):
            return port
    raise launcher.LaunchError(f"found no {count} consecutive free ports in {tries} tries")


def _launch(cfg: ScaleoutConfig, workers: int, gateway: bool, step_ms: float, log_dir: str):
    port = cfg.port or _free_block(workers + 1)
    argv = ["--port", str(port), "--workers", str(workers), "--timeout", str(int(cfg.timeout_s)),
            "--log", f"{log_dir}/w{workers}-{'gw' if gateway else 'direct'}-{port}.log"]
    args, extra = launcher.parse_args(argv + (["--gateway"] if gateway else []))
    return launcher.launch(args, extra + ["--step-ms", f"{step_ms:g}", "--serial"], module=STANDIN_SERVER)


def _chains(urls: Sequence[str], slots: int, cfg: ScaleoutConfig) -> tuple[dict[tuple, tuple], float, int]:
    """Run the chains; {(sampler, prompt, presto): (tokens, history)}, wall seconds, chains."""
    # Here, not at module level (no import circle): these load torch and the SGLang frontend, and `forerun`'s
    # argument parsing imports this module for ScaleoutConfig's defaults (cli.bench_external) before any chain runs
    # (tests/cli/test_args.py: the entry point must not import torch).
    from ...runtime_ext.pool import open_pool
    from .bench import run_pairs

    with open_pool(backend_urls=list(urls), slots=slots) as pool:
        tok = pool.first.tokenizer
        prompts = [(f"math500/{p.id}", chat_prompt_ids(tok, p.messages()))
                   for p in load_prompts("math500", limit=cfg.prompts)]
        start = time.perf_counter()
        pairs = run_pairs(pool, prompts, cfg.sampler_configs(), PrefetchConfig(budget=cfg.npf))
        wall = time.perf_counter() - start
    out = {}
    for pair in pairs:
        for presto, runs in ((False, pair.sequential), (True, pair.presto)):
            for (pid, _), res in zip(prompts, runs):
                out[(pair.sampler, pid, presto)] = (tuple(res.response_ids), tuple(res.history))
    return out, wall, len(out)


def sticky_fraction(counts_per_worker: Sequence[dict[str, int]]) -> float | None:
    """Mean over routing keys of (calls on the key's main worker ÷ the key's calls); None without keys."""
    keys = {k for counts in counts_per_worker for k in counts if k}
    if not keys:
        return None
    shares = []
    for k in keys:
        per_worker = [counts.get(k, 0) for counts in counts_per_worker]
        shares.append(max(per_worker) / sum(per_worker))
    return sum(shares) / len(shares)


def _routing_counts(url: str) -> dict[str, int]:
    """A worker's per-routing-key call counts; EngineError (a failure, exit 1) naming the worker when it no longer
    answers: it died mid-run (the gateway moved its chains elsewhere) and its counters went with it."""
    try:
        with urllib.request.urlopen(url + "/forerun_standin/routing", timeout=10) as resp:
            return dict(json.loads(resp.read())["counts"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EngineError(f"stand-in worker {url} no longer answers after the chains ({exc}): it died during the "
                          "run, so its routing counters are lost") from None


def run_scaleout(cfg: ScaleoutConfig, log_dir: str, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The reference run on one server (no gateway, no step time), then one row per worker count."""
    servers, _ = _launch(cfg, 1, False, 0.0, log_dir)
    try:
        reference, _, _ = _chains([servers[0].url], 1, cfg)
    finally:
        launcher.stop(servers)
    rows: list[dict[str, Any]] = []
    for n in cfg.workers:
        servers, gateway = _launch(cfg, n, cfg.gateway, cfg.step_ms, log_dir)
        try:
            urls = [gateway.url] if gateway is not None else [s.url for s in servers]
            got, wall, chains = _chains(urls, n if gateway is not None else 1, cfg)
            sticky = sticky_fraction([_routing_counts(s.url) for s in servers]) if gateway is not None else None
        finally:
            launcher.stop(servers + ([gateway] if gateway is not None else []))
        rows.append({"workers": n, "chains": chains, "wall_s": wall, "chains_per_s": chains / wall,
                     "sticky_fraction": sticky, "identical": got == reference})
        if progress is not None:
            progress(f"{n} worker(s): {chains / wall:.2f} chains/s")
    base = rows[0]["chains_per_s"] if rows and rows[0]["workers"] == 1 else None
    for row in rows:
        row["speedup"] = row["chains_per_s"] / base if base else None
    return {"gateway": "smg" if cfg.gateway else None, "step_ms": cfg.step_ms, "prompts": cfg.prompts,
            "n": cfg.n, "K": cfg.K, "npf": cfg.npf, "samplers": list(cfg.samplers), "rows": rows}


def format_scaleout(result: dict[str, Any]) -> str:
    head = f"{'workers':>7} {'chains':>6} {'wall (s)':>9} {'chains/s':>9} {'speedup':>8} {'sticky':>7} identical"
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        sticky = "-" if r["sticky_fraction"] is None else f"{r['sticky_fraction']:.3f}"
        speed = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        lines.append(f"{r['workers']:>7} {r['chains']:>6} {r['wall_s']:>9.2f} {r['chains_per_s']:>9.3f} {speed:>8} "
                     f"{sticky:>7} {r['identical']}")
    return "\n".join(lines)
