"""first_bad_byte against Python's own whole-file decode: the offset of the first bad byte and its line, across the
scanner's 1 MiB chunks (a multi-byte character split by a chunk's end included)."""

from __future__ import annotations

import pytest

from forerun.eval.datasets.utf8 import first_bad_byte

CHUNK = 1 << 20


def _oracle(data: bytes) -> tuple[int, int, int] | None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return data[exc.start], exc.start, data.count(b"\n", 0, exc.start) + 1
    return None


@pytest.mark.parametrize("data", [
    b"ok\nalso ok\n",
    b"\xef\xbb\xbfa byte-order mark\n",
    b"line 1\nline 2 \xff\n",
    b"x\n" * (CHUNK // 2 - 1) + b"a" + "é".encode() + b"\n\xfe",  # "é" split by the first chunk's end
    b"\n" * (CHUNK + 5) + b"\xc3(",  # a bad continuation byte past the first chunk
    b"a" * (CHUNK - 1) + b"\n\x80",  # the bad byte right after a newline that closes the first chunk
])
def test_the_first_bad_byte_and_its_line_are_those_a_whole_decode_finds(tmp_path, data):
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    bad = first_bad_byte(path)
    want = _oracle(data)
    assert (None if bad is None else (bad.value, bad.offset, bad.line)) == want
    if want is not None:
        assert bad.describe() == f"byte 0x{want[0]:02x} at offset {want[1]}"
        assert bad.describe(with_line=True).endswith(f", line {want[2]}")


def test_a_limit_stops_the_scan(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes(b"good line\n\xff torn")
    assert first_bad_byte(path, limit=10) is None and first_bad_byte(path).offset == 10
