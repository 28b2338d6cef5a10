"""What a `forerun` command writes: strict JSON on stdout, and output paths checked before any work.

`print_json(obj, reasons=...)` is the one way a command prints `--json`: NaN and ±Infinity are not JSON, so
every non-finite float becomes null and its path is listed under the top-level key "undefined" with the
reason (from `reasons`, keyed by the field's name, or a generic one), then `json.dumps(allow_nan=False)`.

`output_file(path, what)` / `output_dir(path, what, files=...)` check a path a command will write (--records, --out,
--plot, --plots, and the files a directory receives) before it loads a model: the parent directory must already exist (a missing parent is
never created: run as root, that made folders at /), the path must not be a directory (a file) or a file
(a directory) or a FIFO or socket (opening one blocks), it must be writable (probed by opening it, since os.access answers yes to root), and it must
not be one of the command's input files (`inputs`: appending records to the classifier the command reads, or
writing a classifier over the records it trains on, loses the input).  A bad path raises `CommandError`
naming the option.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from .errors import CommandError

__all__ = ["progress_bar", "bars_enabled", "quiet_bars", "strict_json_value", "dumps_strict", "print_json", "output_file",
           "output_dir", "same_file", "not_an_input", "make_output_dir", "REASONS", "PLOT_SUFFIXES"]

REASONS: dict[str, str] = {
    "confidence": "the backend reports no entropy of p0 (a stock SGLang server), so Eq. 22 is undefined",
    "log_likelihood": "the response is empty",
    "transitions_per_call": "no MH call was made",
    "time_per_call_s": "no MH call was made",
    "false_accept": "the gate accepts no decision point at this τ, so r(τ) is undefined",
    "false_accept_ci": "the gate accepts no decision point at this τ, so r(τ) is undefined",
    "coverage_ci": "no decision points",
    "h_ci95": "no pre-position was resolved",
    "measured_h": "no pre-position was resolved",
    "logit_gap": "the request did not use a ready distribution",
}
"""Why a field is undefined when it is NaN, by field name (the generic reason covers the rest)."""

PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def _reason(key: str, value: float, reasons: Mapping[str, str]) -> str:
    if key in reasons:
        return reasons[key]
    return "undefined (not a number)" if math.isnan(value) else f"{value} is not representable in JSON"


def strict_json_value(value: Any, reasons: Mapping[str, str] | None = None) -> tuple[Any, dict[str, str]]:
    """`value` with every non-finite float replaced by None (numpy scalars and arrays become Python), and
    {path: reason} for each replacement."""
    merged = {**REASONS, **(reasons or {})}
    undefined: dict[str, str] = {}

    def clean(v: Any, path: str, key: str) -> Any:
        if isinstance(v, (np.generic, np.ndarray)):
            v = v.tolist()
        if isinstance(v, float):
            if math.isfinite(v):
                return v
            undefined[path or "value"] = _reason(key, v, merged)
            return None
        if isinstance(v, Mapping):
            return {str(k): clean(x, f"{path}.{k}" if path else str(k), str(k)) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x, f"{path}[{i}]", key) for i, x in enumerate(v)]
        return str(v) if isinstance(v, Path) else v

    return clean(value, "", ""), undefined


def dumps_strict(obj: Any, *, reasons: Mapping[str, str] | None = None, indent: int | None = None) -> str:
    """Strict JSON text of `obj` (see the module docstring); never contains NaN or Infinity."""
    clean, undefined = strict_json_value(obj, reasons)
    if undefined:
        if isinstance(clean, dict):
            clean["undefined"] = {**clean.get("undefined", {}), **undefined}
        else:
            clean = {"value": clean, "undefined": undefined}
    return json.dumps(clean, allow_nan=False, indent=indent)


def print_json(obj: Any, *, reasons: Mapping[str, str] | None = None, indent: int | None = None) -> None:
    print(dumps_strict(obj, reasons=reasons, indent=indent), flush=True)


# -- output paths ---------------------------------------------------------------------------------------
def _parent_ok(path: Path, option: str) -> None:
    parent = path.parent
    if not parent.exists():
        raise CommandError(f"{option} {path}: directory {parent} does not exist (create it first)")
    if not parent.is_dir():
        raise CommandError(f"{option} {path}: {parent} is not a directory")


def _blocking_kind(p: Path) -> str | None:
    """"FIFO" or "socket" when opening `p` to write would block until a reader comes, else None."""
    return "FIFO" if p.is_fifo() else "socket" if p.is_socket() else None


def _probe_file(p: Path, option: str) -> None:
    """Open the file as the command will (append, or create): os.access says yes to root even where the
    write then fails (read-only or virtual filesystems).  A probe-created file is removed again."""
    try:
        if p.exists():
            with open(p, "ab"):
                pass
            return
        with open(p, "xb"):
            pass
        p.unlink()
    except OSError as exc:
        raise CommandError(f"{option} {p} is not writable ({exc.strerror or exc})") from None


def _probe_dir(d: Path, option: str, what: Path) -> None:
    try:
        with tempfile.TemporaryFile(dir=d):
            pass
    except OSError as exc:
        raise CommandError(f"{option} {what}: cannot write in {d} ({exc.strerror or exc})") from None


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """True when `a` and `b` both exist and are one file (a link, another spelling of the path)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def not_an_input(p: Path, option: str, inputs: Mapping[str, Any]) -> None:
    """Refuse `p` when it is one of `inputs` ({option: path or paths, None skipped}): an output that is also an
    input would be written over (or appended to) before, or while, it is read."""
    for name, paths in inputs.items():
        for q in [paths] if isinstance(paths, (str, os.PathLike)) else (paths or ()):
            if q is not None and same_file(p, q):
                raise CommandError(f"{option} {p} is also the {name} input; give another path")


def output_file(path: str | os.PathLike[str] | None, option: str, *, suffixes: tuple[str, ...] = (),
                inputs: Mapping[str, Any] | None = None) -> Path | None:
    """Check a file a command will write (or append to); None passes through.  `inputs`: the files the command
    reads, by option ({"--records": [...]}), which the output must not be."""
    if path is None:
        return None
    if not str(path).strip():
        raise CommandError(f"{option} must not be empty")
    p = Path(path).expanduser()
    if p.is_dir():
        raise CommandError(f"{option} {p} is a directory; give a file path")
    if suffixes and p.suffix.lower() not in suffixes:
        raise CommandError(f"{option} {p}: expected a file ending in {' or '.join(suffixes)}")
    _parent_ok(p, option)
    not_an_input(p, option, inputs or {})
    if _blocking_kind(p):  # opening it to write blocked until a reader came: the command hung
        raise CommandError(f"{option} {p} is a {_blocking_kind(p)}, not a regular file; give a file path")
    _probe_file(p, option)
    return p


def output_dir(path: str | os.PathLike[str] | None, option: str, *, files: Iterable[str] = (),
               inputs: Mapping[str, Any] | None = None, writer: str = "the command") -> Path | None:
    """Check a directory a command will write files into: it exists, or its parent does (then
    `make_output_dir` creates it when the files are written); None passes through.  `files`: the names the
    command writes there; in an existing directory, each that is already there must be a file it can write (not
    a directory, FIFO or socket: writing one failed after the work, or blocked) and not one of `inputs`."""
    if path is None:
        return None
    if not str(path).strip():
        raise CommandError(f"{option} must not be empty")
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise CommandError(f"{option} {p} is not a directory")
    if not p.exists():
        _parent_ok(p, option)
    _probe_dir(p if p.exists() else p.parent, option, p)
    for f in (p / name for name in files if p.is_dir()):
        if f.is_dir():
            raise CommandError(f"{option} {p}: {f} is a directory; {writer} writes a file there")
        if _blocking_kind(f):
            raise CommandError(f"{option} {p}: {f} is a {_blocking_kind(f)}, not a regular file; {writer} writes a "
                               "file there")
        not_an_input(f, option, inputs or {})
        if f.exists():
            _probe_file(f, option)
    return p


def make_output_dir(path: Path) -> Path:
    """Create a directory checked by `output_dir` (its parent exists; parents are never created)."""
    path.mkdir(exist_ok=True)
    return path


# -- progress bars -----------------------------------------------------------------------------------------
_QUIET = [False]


def bars_enabled() -> bool:
    """False while a command runs with --quiet or --json."""
    return not _QUIET[0]


class quiet_bars:  # noqa: N801 - a context manager used like a function
    """`with quiet_bars(on):` every `progress_bar` of the command is silent, and so are the bars of the libraries it
    loads models with (transformers' "Loading weights": switched off through huggingface_hub's
    HF_HUB_DISABLE_PROGRESS_BARS, which transformers reads when it is imported, and directly when it already is);
    restored afterwards, except the bars of a transformers first imported during the command."""

    _HUB_VAR = "HF_HUB_DISABLE_PROGRESS_BARS"

    def __init__(self, on: bool) -> None:
        self.on = on

    def __enter__(self) -> None:
        self.previous, _QUIET[0] = _QUIET[0], self.on or _QUIET[0]
        self.silenced, self.hub_var, self.transformers_bars = _QUIET[0], os.environ.get(self._HUB_VAR), None
        if self.silenced:
            os.environ[self._HUB_VAR] = "1"
            logging = sys.modules.get("transformers.utils.logging")
            if logging is not None:
                self.transformers_bars = logging.is_progress_bar_enabled()
                logging.disable_progress_bar()

    def __exit__(self, *exc: Any) -> None:
        _QUIET[0] = self.previous
        if not self.silenced:
            return
        if self.hub_var is None:
            os.environ.pop(self._HUB_VAR, None)
        else:
            os.environ[self._HUB_VAR] = self.hub_var
        logging = sys.modules.get("transformers.utils.logging")
        if logging is not None and self.transformers_bars:  # imported during the command: huggingface_hub fixed
            logging.enable_progress_bar()  # the variable at its import and refuses (warns) to enable them again


def progress_bar(**kwargs: Any) -> Any:
    """A tqdm bar on stderr, off under --quiet / --json."""
    from tqdm import tqdm

    kwargs.setdefault("file", sys.stderr)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(disable=bool(kwargs.pop("disable", False)) or not bars_enabled(), **kwargs)
