"""A config's error in the words the user typed.  The frozen configs (SamplerConfig, BenchConfig, EvalSettings, ...)
validate in `__post_init__` and name their FIELD (`calib_windows must be 0 (skip) or >= 2`); a command that builds
one from its flags reports the FLAG instead (`forerun bench preposition: --calib-windows must be 0 (skip) or >= 2`).

    with flags_named(args, SamplerConfig, response_length="n", block_size="block", steps_per_block="K"):
        config = SamplerConfig(response_length=args.n, block_size=args.block, ...)

The field -> flag map is derived, not written per config: a field names the option whose argparse dest is the
field's name (or the dest the call site gives where the two differ, as above), and that option's flag is read
from the command's parser (`record_flags`, called on every command's parser by `main.build_parser`).  A field
with no such option is left as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
from typing import Iterator, Mapping

from .errors import CommandError, one_line

__all__ = ["record_flags", "field_flags", "name_flags", "flags_named"]

FLAGS_ATTR = "flag_of_dest"
"""The namespace attribute holding {dest: "--flag"} of the command that parsed it (`record_flags`)."""


def record_flags(parser: argparse.ArgumentParser) -> None:
    """Keep {dest: its first long option} of `parser`'s options in the namespace it parses (a default)."""
    flags: dict[str, str] = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest != argparse.SUPPRESS:
            flags.setdefault(action.dest, longs[0])
    parser.set_defaults(**{FLAGS_ATTR: flags})


def field_flags(args: argparse.Namespace, config_type: type, dests: Mapping[str, str]) -> dict[str, str]:
    """{field of `config_type`: the flag that sets it}: the flag of dest `dests.get(field, field)`, where the command
    has one."""
    flags = getattr(args, FLAGS_ATTR, None) or {}
    out = {}
    for field in dataclasses.fields(config_type):
        flag = flags.get(dests.get(field.name, field.name))
        if flag is not None:
            out[field.name] = flag
    return out


def name_flags(message: str, flags: Mapping[str, str]) -> str:
    """`message` with each field name of `flags` (a whole word, not part of a flag or a dotted name) replaced by
    its flag."""
    if not flags:
        return message
    names = "|".join(re.escape(name) for name in sorted(flags, key=len, reverse=True))
    return re.sub(rf"(?<![\w.-])({names})(?![\w-])", lambda m: flags[m.group(1)], message)


@contextlib.contextmanager
def flags_named(args: argparse.Namespace, config_type: type, **dests: str) -> Iterator[None]:
    """Build a `config_type` from the command's flags: a ValueError raised inside becomes a CommandError (one line,
    exit 2) naming the flags for the fields.  `dests`: field=dest where the field's name is not the flag's dest."""
    try:
        yield
    except ValueError as exc:
        raise CommandError(name_flags(one_line(exc), field_flags(args, config_type, dests))) from None
