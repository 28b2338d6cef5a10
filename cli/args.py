"""Argument types shared by the `forerun` subcommands (argparse `type=` callables with clear messages)."""

from __future__ import annotations

import argparse


def _number(text: str, kind: type, lowest: float, inclusive: bool) -> int | float:
    noun = "an integer" if kind is int else "a number"
    bound = f">= {lowest:g}" if inclusive else f"> {lowest:g}"
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {noun} {bound}, got {text!r}") from None
    if not (value >= lowest if inclusive else value > lowest):  # also rejects NaN
        raise argparse.ArgumentTypeError(f"expected {noun} {bound}, got {text}")
    return value


def positive_int(text: str) -> int:
    return int(_number(text, int, 1, True))


def nonnegative_int(text: str) -> int:
    return int(_number(text, int, 0, True))


def positive_float(text: str) -> float:
    return float(_number(text, float, 0, False))


def nonnegative_float(text: str) -> float:
    return float(_number(text, float, 0, True))


def add_model_arguments(parser: argparse.ArgumentParser, *, default: str = "default",
                        with_backend: bool = False) -> None:
    """`--model` and `--dtype` for commands that load a model into the embedded engine."""
    ignored = " (ignored with --backend)" if with_backend else ""
    parser.add_argument("--model", default=default,
                        help=f"default | tiny | path to a HF folder or .gguf file (default: {default}){ignored}")
    parser.add_argument("--dtype", default=None,
                        help="float32 (default) | bfloat16 (bf16 weights, float32 activations, KV and log-probs: the "
                             "MH target is this bf16 model's p0) | float64 (tiny's default); batch-invariant in "
                             f"each (a warning says when the engine cannot be){ignored}")
