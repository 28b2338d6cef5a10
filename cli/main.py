"""The `forerun` command line.

Each area registers its subcommands from its own module (`register(subparsers, bench_subparsers)`);
`COMMAND_MODULES` lists them.  Every long-running command shows a progress bar on stderr and accepts
`--json` for strict JSON on stdout (cli/output.py).  Every command follows one exit-code table (cli/errors.py,
README "Exit codes and bad input"):

    0 ok    1 failure (engine or server, a failed eval item, a bug)    2 usage (bad input)    130 interrupted

Bad input is one line on stderr, never a traceback, found before any model loads where it can be: `--backend`
URLs (runtime_ext/backends/server_config.py), options that do not apply (cli/applicability.py), input files
that are not UTF-8 (cli/inputs.py), output paths (cli/output.py).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, NoReturn, Sequence

from .errors import interrupt_exits, run_guarded

# transformers' warnings (a prompt over the tokenizer's model_max_length, ...) are not the command's one line on
# stderr: what matters there, the commands check and say themselves (read when transformers is imported)
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

with interrupt_exits():  # importing the commands takes a second or more (torch)
    from . import bench_external, classifier, engine, evaluate, preposition, presto
    from .args import check_model_path
    from .config_flags import record_flags
    from .output import quiet_bars

COMMAND_MODULES = (engine, classifier, preposition, presto, bench_external, evaluate)


NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)
"""A command-line word that is a negative number (float() reads it) rather than an option."""


class OneLineParser(argparse.ArgumentParser):
    """argparse with its usage errors on one line: `forerun sample: error: ... (see --help)`, and no abbreviated
    options (`--budget` is not `--budget-unit`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # what is a negative number, not an option: argparse's own pattern knows only -5 and -.5, so `--tau -inf` or
        # `--temperature -1e-3` ended in 'expected one argument' instead of the option's own range message
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="forerun", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks that print side-by-side ratios from one run")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    for module in COMMAND_MODULES:
        module.register(sub, bench_sub)
    for leaf in _leaf_parsers(parser):
        leaf.add_argument("--quiet", "-q", action="store_true", help="no progress bars (--json implies it)")
        record_flags(leaf)  # a config's error names the flag, not the field (cli/config_flags.py)
    return parser


def _leaf_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers of the commands themselves (those with a handler)."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += _leaf_parsers(child)
    return out + ([parser] if parser.get_default("handler") is not None else [])


def command_name(args: argparse.Namespace) -> str:
    """"sample", "bench presto", "classifier train", ...: the words the user typed."""
    words = [args.command]
    for attr in ("bench_command", "session_command", "calibrate_command", "classifier_command", "eval_command"):
        if getattr(args, attr, None):
            words.append(getattr(args, attr))
    return " ".join(words)


def _command_parser(parser: argparse.ArgumentParser, words: Sequence[str]) -> argparse.ArgumentParser:
    """The parser of the command `words` ("session", "demo") names, for its usage errors."""
    for word in words:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    with interrupt_exits():
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # named by the command that was given them: `forerun session demo: error: ...`
            _command_parser(parser, command_name(args).split()).error(f"unrecognized arguments: {' '.join(unknown)}")
    quiet = getattr(args, "quiet", False) or getattr(args, "json", False)

    def run() -> int | None:
        check_model_path(args)  # before the handler's heavy imports
        return args.handler(args)

    with quiet_bars(quiet):
        return run_guarded(command_name(args), run)


if __name__ == "__main__":
    sys.exit(main())
