"""The wire between the program's process and the tests' process (sandbox_wire, and the tests' side of it
in sandbox_inside): values cross as plain data only.

The oracle is Python's own equality and `type()` on values built here, independent of the codec: a round
trip must give an equal value of exactly the same types, and whatever the program sends, the tests' side
builds nothing but builtin types (or opaque handles whose equality is identity)."""

from __future__ import annotations

import collections
import decimal
import fractions
import json

import pytest

from forerun.eval.graders.sandbox_inside import Client, Remote
from forerun.eval.graders.sandbox_wire import MAX_DEPTH, WireError, decode, encode


def _types(x):
    """The exact types in a value, recursively (the oracle for "plain data only")."""
    out = {type(x)}
    if isinstance(x, dict):
        for k, v in x.items():
            out |= _types(k) | _types(v)
    elif isinstance(x, (list, tuple, set, frozenset, collections.deque)):
        for v in x:
            out |= _types(v)
    return out


def _no_handles(obj):
    raise AssertionError(f"unexpected handle for {obj!r}")


def _roundtrip(x):
    wire = json.loads(json.dumps(encode(x, _no_handles)))  # through JSON text, as on the pipe
    return decode(wire, lambda hid, name: pytest.fail("no handles expected"))


VALUES = [
    None, True, False, 0, -7, 3 ** 200, -(5 ** 300), 1.5, float("inf"), -0.0, "", "héllo\n\x00", [1, [2, [3]]],
    (1, "a"), (), {"a": 1, 2: [3], (4, 5): {6}}, {1, 2.5, "x"}, frozenset({(1, 2)}), b"\x00\xff", bytearray(b"ab"),
    complex(1, -2), range(3, 10, 2), fractions.Fraction(-3, 7), decimal.Decimal("1.10"),
    collections.Counter("abca"), collections.OrderedDict([("b", 1), ("a", 2)]),
    collections.defaultdict(list, {"k": [1]}), collections.deque([1, 2], maxlen=5), [{"nested": ({1: (2, [3])},)}],
]


@pytest.mark.parametrize("value", VALUES, ids=[type(v).__name__ + str(i) for i, v in enumerate(VALUES)])
def test_round_trip_keeps_value_and_exact_types(value):
    back = _roundtrip(value)
    assert back == value
    assert _types(back) == _types(value)
    if isinstance(value, collections.defaultdict):
        assert back.default_factory is value.default_factory
    if isinstance(value, collections.deque):
        assert back.maxlen == value.maxlen


def test_nan_survives():
    back = _roundtrip([float("nan")])
    assert back[0] != back[0]


def test_rigged_objects_reach_the_tests_as_plain_values_or_opaque_handles():
    class AlwaysEqual:
        def __eq__(self, other):
            return True

    class LyingInt(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    class LyingList(list):
        def __eq__(self, other):
            return True

    held = []
    wire = encode([AlwaysEqual(), LyingInt(3), LyingList([1]), "s"], lambda o: held.append(o) or {"~h": [0, "x"]})
    got = decode(json.loads(json.dumps(wire)), lambda hid, name: Remote(None, hid, name))
    assert type(got[0]) is Remote and got[0] != 7 and not (got[0] == 7)  # equality is identity
    assert type(got[1]) is int and got[1] == 3 and got[1] != 4
    assert type(got[2]) is list and got[2] != [2]
    assert len(held) == 1


@pytest.mark.parametrize("wire", [
    {"~nope": 1}, {"~t": 5}, {"a": 1, "b": 2}, {"~d": [[1]]}, {"~d": [[[1], 2]]}, {"~c": ["1", 2]},
    {"~b": "not base64!"}, {"~defaultdict": ["os.system", []]}, {"~h": ["1", "x"]}, {"~q": [1, 0]},
    {"~r": [1, 2, 0]}, {"~i": "zz"}, {"~dec": "1" * 20000},
])
def test_malformed_wire_is_refused(wire):
    with pytest.raises(WireError):
        decode(wire, lambda hid, name: object())


def test_nesting_is_bounded_on_both_sides():
    deep: list = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(ValueError):
        encode(deep, _no_handles)
    wire: object = 1
    for _ in range(MAX_DEPTH + 5):
        wire = {"~t": [wire]}
    with pytest.raises(WireError):
        decode(wire, lambda hid, name: object())


def test_values_the_tests_cannot_send_are_named():
    with pytest.raises(TypeError, match="cannot be passed"):
        Client(None).out([lambda: 1])
