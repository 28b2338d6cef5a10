"""Where a file stops being UTF-8 text: the first byte that does not decode, its offset and its line.

Text readers decode ahead of the line they return and raise a UnicodeDecodeError that names neither the file nor
where in it; the dataset loader (`loading`) and the CLI's input checks (`cli.inputs`) scan the file with this
instead, in chunks, only when they need to say where.
"""

from __future__ import annotations

import codecs
import os
from dataclasses import dataclass

_CHUNK = 1 << 20


@dataclass(frozen=True)
class BadByte:
    """The first byte of a file that is not UTF-8: its value, its offset and its line (1-based)."""

    value: int
    offset: int
    line: int

    def describe(self, *, with_line: bool = False) -> str:
        """ "byte 0xff at offset 16" (", line 2" with_line)."""
        return f"byte 0x{self.value:02x} at offset {self.offset}" + (f", line {self.line}" if with_line else "")


def first_bad_byte(path: str | os.PathLike[str], limit: int | None = None) -> BadByte | None:
    """The first byte of `path` (of its first `limit` bytes) that is not UTF-8, None when it all decodes; OSError
    when the file cannot be read.  A byte-order mark decodes (U+FEFF)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # bytes of the file fed to the decoder so far
    newlines = 0  # in those bytes
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(_CHUNK if limit is None else min(_CHUNK, limit - offset))
            pending = decoder.getstate()[0]  # bytes of an unfinished character kept from the last chunk
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                data = pending + chunk
                at = offset - len(pending) + exc.start
                line = newlines - pending.count(b"\n") + data.count(b"\n", 0, exc.start) + 1
                return BadByte(data[exc.start], at, line)
            if not chunk:
                return None
            offset += len(chunk)
            newlines += chunk.count(b"\n")
