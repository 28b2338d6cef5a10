"""Input files a command reads (records, classifiers, datasets, run files, the reference): a file that is not
UTF-8 text is one line on stderr that names the file and the byte offset of the first bad byte, exit 2.

    forerun classifier train: --records runs/nodes.jsonl: not UTF-8 text (byte 0xff at offset 16)

The readers themselves decode line by line and raise a UnicodeDecodeError that names neither the file nor
the offset in it; `naming_undecodable(paths)` turns that error into the line above by scanning the given files
(only when the error happens).  Dataset files need no such wrapper: `load_prompts` raises a DatasetError that
names the file, the offset and the line itself (eval/datasets/loading.py).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterable, Iterator

from .errors import CommandError
from ..eval.datasets.utf8 import first_bad_byte

__all__ = ["utf8_problem", "check_utf8", "naming_undecodable", "dataset_paths"]



def utf8_problem(path: str | os.PathLike[str], limit: int | None = None) -> str | None:
    """"byte 0xff at offset 16" for the first byte of `path` (of its first `limit` bytes) that is not UTF-8, None
    when it all decodes (or cannot be read: the reader reports that itself)."""
    try:
        bad = first_bad_byte(path, limit)
    except OSError:
        return None
    return bad.describe() if bad is not None else None


def check_utf8(path: str | os.PathLike[str], option: str | None = None, *,
               complete_lines: bool = False) -> str | os.PathLike[str]:
    """`path`, or CommandError when it is not UTF-8 text (for readers that report a bad byte without the offset,
    such as the run-file reader).  complete_lines: up to the last newline only (an append-only file's torn last
    line, cut inside a character on a full disk, is its reader's to repair)."""
    limit = None
    if complete_lines:
        try:
            limit = Path(path).read_bytes().rfind(b"\n") + 1
        except OSError:
            return path  # the reader reports it
    problem = utf8_problem(path, limit)
    if problem is not None:
        raise CommandError(f"{option + ' ' if option else ''}{path}: not UTF-8 text ({problem})")
    return path


@contextlib.contextmanager
def naming_undecodable(paths: Iterable[str | os.PathLike[str] | None], option: str | None = None) -> Iterator[None]:
    """Run a reader of `paths`; a UnicodeDecodeError it raises becomes a CommandError naming the first of
    `paths` that is not UTF-8 (prefixed with `option`, e.g. "--records"), and the offset."""
    paths = [p for p in paths if p is not None]
    try:
        yield
    except UnicodeDecodeError:
        for path in paths:
            check_utf8(path, option)
        raise


def dataset_paths(name: str | None, data_dir: str | os.PathLike[str] | None,
                  file: str | os.PathLike[str] | None = None) -> list[Path]:
    """The files `load_prompts(name, data_dir=..., file=...)` reads (empty when it would fail before reading): inputs an
    output path must not replace."""
    from ..eval.datasets.loading import resolve_data_dir
    from ..eval.datasets.registry import dataset_spec

    if file is not None:
        return [Path(file)]
    try:
        spec, source = dataset_spec(name or ""), resolve_data_dir(data_dir)
    except (KeyError, ValueError):  # DatasetError is a ValueError
        return []
    return [source.path / f for f in (spec.packaged if source.packaged else spec.files)]
