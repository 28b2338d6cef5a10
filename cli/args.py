"""Argument types shared by the `forerun` subcommands (argparse `type=` callables with clear messages).

A rejected value is reported by argparse as one line (`forerun sample: error: argument --tau: ...`)
before any model is loaded.
"""

from __future__ import annotations

import argparse
import math
import os

from ..runtime_ext.model_spec import missing_model_path
from .errors import CommandError


def _number(text: str, kind: type, lowest: float, inclusive: bool) -> int | float:
    noun = "an integer" if kind is int else "a number"
    bound = f">= {lowest:g}" if inclusive else f"> {lowest:g}"
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {noun} {bound}, got {text!r}") from None
    if not (value >= lowest if inclusive else value > lowest) or (kind is float and math.isinf(value)):
        raise argparse.ArgumentTypeError(f"expected {noun} {bound}, got {text}")  # also rejects NaN and inf
    return value


def comma_items(text: str, flag: str | None = None) -> list[str]:
    """The items of a comma-separated list option ("a, b" -> ["a", "b"]), stripped; every list option splits its
    value here.  An empty item ("a,,b", a leading or trailing comma, a blank value) is refused, not skipped: it is a
    typo or an unset shell variable ("math500,$MORE"), and skipping it ran less than was asked.  `flag`: None in an
    argparse `type=` (argparse names the option), else the option to name (a CommandError: exit 2)."""
    items = [part.strip() for part in text.split(",")]
    empty = next((i for i, item in enumerate(items, 1) if not item), None)
    if empty is not None:
        message = f"item {empty} of the comma-separated list {text!r} is empty"
        if flag is None:
            raise argparse.ArgumentTypeError(message)
        raise CommandError(f"{flag}: {message}")
    return items


def positive_int(text: str) -> int:
    return int(_number(text, int, 1, True))


def nonnegative_int(text: str) -> int:
    return int(_number(text, int, 0, True))


SEED_MAX = 2**63 - 1
"""The largest seed: SGLang refuses sampling seeds outside int64, and the engine's noise keys are 64-bit (a larger
seed would alias another)."""


def seed_int(text: str) -> int:
    seed = int(_number(text, int, 0, True))
    if seed > SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected a seed in [0, 2**63 - 1], got {text}")
    return seed


def fold_seed_int(text: str) -> int:
    """A seed scikit-learn takes as `random_state`: [0, 2**32 - 1] (NumPy's legacy seeding)."""
    seed = int(_number(text, int, 0, True))
    if seed > 2**32 - 1:
        raise argparse.ArgumentTypeError(f"expected a seed in [0, 2**32 - 1] (scikit-learn's random_state), got {text}")
    return seed


def fold_count(text: str) -> int:
    """Cross-validation folds: an integer >= 2."""
    return int(_number(text, int, 2, True))


def positive_float(text: str) -> float:
    return float(_number(text, float, 0, False))


def nonnegative_float(text: str) -> float:
    return float(_number(text, float, 0, True))


def finite_float(text: str) -> float:
    """Any finite number (NaN and ±inf rejected)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
    return value


def input_path(text: str) -> str:
    """A file the command reads: an empty argument (an unset shell variable) is refused, not read as the current
    directory or taken for the option's absent default."""
    if not text:
        raise argparse.ArgumentTypeError("expected a file path, got ''")
    return text


def utf8_text(text: str) -> str:
    """Text given on the command line (a prompt, a system turn): bytes of an argument that are not UTF-8 (Python
    keeps them as lone surrogates, which no tokenizer takes) are refused as input files that are not UTF-8 are,
    naming the first bad byte and its offset in the argument."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")  # the argument's bytes as they were given
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogatepass")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    return text


def gate_threshold(text: str) -> float:
    """τ of the logit-gap gate: a number >= 0, or `inf` (the gate never fires).  γ >= 0 always, so a
    negative τ would mean "always fire": rejected (benchmarks force the gate explicitly)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 (or inf: the gate never fires), got {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 (or inf: the gate never fires), got {text}")
    return value


def gate_threshold_or_auto(text: str) -> float | str:
    """`auto` (τ from the calibration for the risk budget r_max) or a `gate_threshold`."""
    return "auto" if text.strip().lower() == "auto" else gate_threshold(text)


def thread_count(text: str) -> int:
    """torch threads: 1 .. the number of CPUs of this machine."""
    value = positive_int(text)
    cpus = os.cpu_count() or 1
    if value > cpus:
        raise argparse.ArgumentTypeError(f"expected 1 to {cpus} (the CPUs of this machine), got {value}")
    return value


def dataset_name(text: str) -> str:
    """A dataset name or alias of eval.datasets (the registry's canonical name is returned)."""
    from ..eval.datasets.registry import dataset_spec

    try:
        return dataset_spec(text).name
    except KeyError as exc:
        raise argparse.ArgumentTypeError(str(exc.args[0])) from None


def add_model_arguments(parser: argparse.ArgumentParser, *, default: str = "default",
                        with_backend: bool = False) -> None:
    """`--model` and `--dtype` for commands that load a model into the embedded engine."""
    ignored = " (ignored with --backend)" if with_backend else ""
    parser.add_argument("--model", default=default,
                        help=f"default | tiny | path to a HF folder or .gguf file (default: {default}){ignored}")
    parser.add_argument("--dtype", default=None,
                        help="float32 (default) | bfloat16 (bf16 weights, float32 activations, KV and log-probs: the "
                             "MH target is this bf16 model's p0) | float16 (the same with fp16 weights) | float64 "
                             "(tiny's default); batch-invariant in "
                             f"each (a warning says when the engine cannot be){ignored}")
    parser.set_defaults(checks_model_path=True)


def check_model_path(args: argparse.Namespace) -> None:
    """Refuse a `--model` path that does not exist (unless --backend makes --model ignored) before the command
    imports torch or loads anything: the same one line the model loader would give, seconds earlier."""
    if not getattr(args, "checks_model_path", False) or getattr(args, "backend", None):
        return
    missing = missing_model_path(args.model)
    if missing is not None:
        raise CommandError(missing)
