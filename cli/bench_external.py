"""`forerun bench reference` and `forerun bench scaleout`: PowerMH against outside yardsticks.

    forerun bench reference --reference PATH [--prompts --K --n --alpha --seed --threads] [--json]
    forerun bench scaleout [--workers 1 2 4] [--gateway | --no-gateway] [--prompts --n --K --npf --step-ms] [--json]

`reference` times sequential PowerMH per MH step beside Karan & Du's own `power_samp_utils.py` on the same weights;
`scaleout` runs the benchmark's chains over stand-in SGLang workers behind the SGLang Model Gateway (smg).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .args import nonnegative_float, nonnegative_int, positive_float, positive_int, seed_int
from .errors import CommandError, reports_errors
from .inputs import naming_undecodable
from .output import print_json
from ..eval.presto.reference import ReferenceConfig
from ..eval.presto.scaleout import ScaleoutConfig

__all__ = ["register", "bench_reference_command", "bench_scaleout_command"]

_SCALE = ScaleoutConfig()
"""`bench scaleout`'s defaults, read from its config type."""
_REF = ReferenceConfig(reference="")
"""`bench reference`'s defaults, read from its config type."""


def register(subparsers: Any, bench_subparsers: Any) -> None:
    r = bench_subparsers.add_parser("reference", help="sequential PowerMH vs Karan & Du's reference, per MH step, one run")
    r.add_argument("--reference", required=True, help="path to the reference's llm_experiments/power_samp_utils.py")
    r.add_argument("--prompts", type=positive_int, default=_REF.prompts, help=f"first MATH500 prompts ({_REF.prompts})")
    r.add_argument("--K", type=positive_int, default=_REF.K, help=f"MH steps per chain ({_REF.K})")
    r.add_argument("--n", type=positive_int, default=_REF.n, help=f"response length, one block ({_REF.n})")
    r.add_argument("--alpha", type=positive_float, default=_REF.alpha, help=f"power α; τ = 1/α ({_REF.alpha:g})")
    r.add_argument("--seed", type=seed_int, default=_REF.seed)
    r.add_argument("--threads", type=positive_int, default=None, help="torch threads of both (default: torch's)")
    r.add_argument("--json", action="store_true", help="print a JSON object on stdout")
    r.set_defaults(handler=bench_reference_command)

    o = bench_subparsers.add_parser("scaleout", help="chains/s over 1, 2, 4 stand-in SGLang workers behind the SGLang "
                                                     "Model Gateway (smg): throughput, stickiness, identical chains")
    o.add_argument("--workers", type=positive_int, nargs="+", default=list(_SCALE.workers),
                   help=f"worker counts ({' '.join(map(str, _SCALE.workers))})")
    o.add_argument("--gateway", action=argparse.BooleanOptionalAction, default=_SCALE.gateway,
                   help="through the smg gateway (default); --no-gateway: the worker URLs given to the client")
    o.add_argument("--prompts", type=positive_int, default=_SCALE.prompts, help=f"MATH500 prompts ({_SCALE.prompts})")
    o.add_argument("--n", type=positive_int, default=_SCALE.n, help=f"response length n ({_SCALE.n})")
    o.add_argument("--K", type=positive_int, default=_SCALE.K, help=f"MH transitions per block ({_SCALE.K})")
    o.add_argument("--npf", type=positive_int, default=_SCALE.npf, help=f"prefetch budget N_pf ({_SCALE.npf})")
    o.add_argument("--step-ms", type=nonnegative_float, default=_SCALE.step_ms,
                   help=f"stand-in worker decode step in ms ({_SCALE.step_ms:g})")
    o.add_argument("--json", action="store_true", help="print a JSON object on stdout (its last line)")
    o.set_defaults(handler=bench_scaleout_command)


@reports_errors("bench reference")
def bench_reference_command(args: argparse.Namespace) -> int:
    from ..eval.presto.reference import load_reference, run

    cfg = ReferenceConfig(reference=args.reference, prompts=args.prompts, K=args.K, n=args.n, alpha=args.alpha,
                          seed=args.seed, threads=args.threads)
    try:
        with naming_undecodable([cfg.reference], "--reference"):
            load_reference(cfg.reference)  # a wrong file is found before any model loads
    except CommandError:
        raise
    except (OSError, SyntaxError, ValueError) as exc:
        raise CommandError(f"--reference {args.reference}: {exc}") from None
    out = run(cfg)
    if args.json:
        print_json(out)
        return 0
    print(f"sequential PowerMH per MH step, n = {out['n']}, K = {out['K']}, {out['prompts']} prompts: "
          f"reference {out['reference_s_per_step']:.3f} s, forerun {out['forerun_s_per_step']:.3f} s -> "
          f"{out['ratio_per_step_raw']:.2f}x raw, {out['ratio_per_step_fitted']:.2f}x fitted, "
          f"{out['ratio_per_generated_token']:.2f}x per generated token")
    return 0


@reports_errors("bench scaleout")
def bench_scaleout_command(args: argparse.Namespace) -> int:
    import tempfile

    from ..eval.datasets.loading import load_prompts
    from ..eval.presto.scaleout import format_scaleout, run_scaleout
    from ..runtime_ext.launch import LaunchError
    from ..runtime_ext.protocol import EngineError

    cfg = ScaleoutConfig(workers=tuple(args.workers), gateway=args.gateway, prompts=args.prompts, n=args.n, K=args.K,
                         npf=args.npf, step_ms=args.step_ms)
    available = len(load_prompts("math500", limit=args.prompts))
    if available < args.prompts:  # before any worker starts
        raise CommandError(f"math500 has only {available} prompts here, asked for {args.prompts}")
    with tempfile.TemporaryDirectory(prefix="forerun-scaleout-") as logs:
        try:
            out = run_scaleout(cfg, logs, progress=lambda line: print(f"bench scaleout: {line}", file=sys.stderr))
        except LaunchError as exc:  # code 2: something missing (smg, a free port); else a worker that failed
            line = str(exc).splitlines()[0]
            raise (CommandError(line) if exc.code == 2 else EngineError(line)) from None
    if args.json:
        print_json(out)
        return 0
    print(format_scaleout(out))
    return 0
