"""The `forerun` command line.

Each area registers its subcommands from its own module (`register(subparsers, bench_subparsers)`);
`COMMAND_MODULES` lists them.  Every long-running command shows a progress bar on stderr and accepts
`--json` for strict JSON on stdout (cli/output.py).  Bad input is one line on stderr and a non-zero exit,
never a traceback; Ctrl-C prints `forerun: interrupted` and exits 130 (cli/errors.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Sequence

from . import classifier, engine, evaluate, preposition, presto
from .errors import run_guarded

COMMAND_MODULES = (engine, classifier, preposition, presto, evaluate)


class OneLineParser(argparse.ArgumentParser):
    """argparse with its usage errors on one line: `forerun sample: error: ... (see --help)`."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="forerun", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks that print side-by-side ratios from one run")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    for module in COMMAND_MODULES:
        module.register(sub, bench_sub)
    return parser


def command_name(args: argparse.Namespace) -> str:
    """"sample", "bench presto", "classifier train", ...: the words the user typed."""
    words = [args.command]
    for attr in ("bench_command", "session_command", "calibrate_command", "classifier_command"):
        if getattr(args, attr, None):
            words.append(getattr(args, attr))
    return " ".join(words)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_guarded(command_name(args), lambda: args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
