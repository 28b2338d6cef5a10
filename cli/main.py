"""The `forerun` command line.

Each area registers its subcommands from its own module (`register(subparsers, bench_subparsers)`);
`COMMAND_MODULES` lists them.  Every long-running command shows a progress bar on stderr and accepts
`--json` for machine-readable output on stdout.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import classifier, engine, evaluate, preposition, presto

COMMAND_MODULES = (engine, classifier, preposition, presto, evaluate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forerun", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks that print side-by-side ratios from one run")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    for module in COMMAND_MODULES:
        module.register(sub, bench_sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("forerun: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
