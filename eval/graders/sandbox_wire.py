"""The wire between the sandbox's two processes (`sandbox_inside`): a codec for plain data and a line channel.

Standard library only; copied next to `sandbox_inside.py` into each sandbox directory.  One JSON object per
line.  Values: JSON null/bool/number/string/array (list) as themselves; every other value is an object with
one "~tag" key:

    tag             value                      tag              value
    ~i              int beyond 2**256 (hex)    ~r               range
    ~t / ~d         tuple / dict (pairs)       ~q / ~dec        Fraction / Decimal
    ~s / ~fs        set / frozenset            ~Counter         collections.Counter (pairs)
    ~b / ~ba        bytes / bytearray (b64)    ~OrderedDict     collections.OrderedDict (pairs)
    ~c              complex                    ~defaultdict     [factory name (builtin types only), pairs]
    ~h              [id, type name]: a handle  ~deque           [items, maxlen]
                    to an object kept in C

`decode` builds values with builtin constructors only, so whatever arrives, the receiver holds plain data.
"""

from __future__ import annotations

import base64
import json
import os
import sys

MAX_DEPTH = 200
_BIG = 1 << 256  # ints at least this large travel as hex (decimal conversion of huge ints is capped)
_FACTORIES = {"list": list, "int": int, "set": set, "dict": dict, "str": str, "float": float, "tuple": tuple,
              "frozenset": frozenset, "bool": bool}


class WireError(BaseException):
    """The other side broke the protocol or went away.  A BaseException, so that test code which catches
    Exception cannot swallow it."""


def encode(x, hold, depth=0):
    """`x` as wire data; objects that are not plain data become `hold(x)` (a handle), or raise TypeError."""
    import collections
    import decimal
    import fractions
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    d = depth + 1
    if x is None or x is True or x is False:
        return x
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int):
        x = int.__index__(x)
        return x if -_BIG < x < _BIG else {"~i": format(x, "x")}
    if isinstance(x, float):
        return float.__float__(x)
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, list):
        return [encode(v, hold, d) for v in list.__iter__(x)]
    if isinstance(x, tuple):
        return {"~t": [encode(v, hold, d) for v in tuple.__iter__(x)]}
    if isinstance(x, dict):
        pairs = [[encode(k, hold, d), encode(v, hold, d)] for k, v in dict.items(x)]
        if isinstance(x, collections.Counter):
            return {"~Counter": pairs}
        if isinstance(x, collections.OrderedDict):
            return {"~OrderedDict": pairs}
        if isinstance(x, collections.defaultdict):
            f = x.default_factory
            name = next((n for n, c in _FACTORIES.items() if f is c), None)
            return {"~defaultdict": [name, pairs]}
        return {"~d": pairs}
    if isinstance(x, frozenset):
        return {"~fs": [encode(v, hold, d) for v in frozenset.__iter__(x)]}
    if isinstance(x, set):
        return {"~s": [encode(v, hold, d) for v in set.__iter__(x)]}
    if isinstance(x, (bytes, bytearray)):
        return {"~ba" if isinstance(x, bytearray) else "~b": base64.b64encode(bytes(x)).decode()}
    if isinstance(x, complex):
        return {"~c": [complex.__getattribute__(x, "real"), complex.__getattribute__(x, "imag")]}
    if isinstance(x, range):
        return {"~r": [x.start, x.stop, x.step]}
    if isinstance(x, fractions.Fraction):
        return {"~q": [encode(x.numerator, hold, d), encode(x.denominator, hold, d)]}
    if isinstance(x, decimal.Decimal):
        return {"~dec": str(x)}
    if isinstance(x, collections.deque):
        return {"~deque": [[encode(v, hold, d) for v in collections.deque.__iter__(x)], x.maxlen]}
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.generic):
        return encode(x.item(), hold, d)
    return hold(x)


def _num(v):
    if type(v) in (int, float):
        return v
    raise WireError(f"expected a number, got {type(v).__name__}")


def _int(v):
    if type(v) is int:
        return v
    if type(v) is dict and set(v) == {"~i"} and type(v["~i"]) is str:
        try:
            return int(v["~i"], 16)
        except ValueError:
            raise WireError("bad big int") from None
    raise WireError(f"expected an int, got {type(v).__name__}")


def _list(v):
    if type(v) is not list:
        raise WireError(f"expected a list, got {type(v).__name__}")
    return v


def _pairs(body, d):
    out = []
    for p in _list(body):
        p = _list(p)
        if len(p) != 2:
            raise WireError("a dict item is not a pair")
        out.append((d(p[0]), d(p[1])))
    return out


def _bytes(body):
    if type(body) is not str:
        raise WireError("bytes must be base64 text")
    return base64.b64decode(body.encode("ascii"), validate=True)


def _decimal(body):
    import decimal
    if type(body) is not str or len(body) > 10_000:
        raise WireError("bad Decimal")
    return decimal.Decimal(body)


def _defaultdict(body, d):
    import collections
    name, pairs = _fixed(body, 2, lambda x: x)
    if name is not None and name not in _FACTORIES:
        raise WireError("unknown defaultdict factory")
    return collections.defaultdict(_FACTORIES.get(name), _pairs(pairs, d))


def _deque(body, d):
    import collections
    vals, maxlen = _fixed(body, 2, lambda x: x)
    return collections.deque([d(x) for x in _list(vals)], None if maxlen is None else _int(maxlen))


def _handle(body, resolve):
    hid, name = _fixed(body, 2, lambda x: x)
    if type(hid) is not int or type(name) is not str:
        raise WireError("bad handle")
    return resolve(hid, name[:100])


def _fixed(body, n, kind):
    items = _list(body)
    if len(items) != n:
        raise WireError(f"expected {n} items")
    return [kind(x) for x in items]


def _fraction(body):
    import fractions
    return fractions.Fraction(*_fixed(body, 2, _int))


def _counter(body, d):
    import collections
    return collections.Counter(dict(_pairs(body, d)))


def _ordered(body, d):
    import collections
    return collections.OrderedDict(_pairs(body, d))


_TAGS = {  # tag -> (body, decode one value, resolve a handle) -> value
    "~i": lambda b, d, r: _int({"~i": b}),
    "~t": lambda b, d, r: tuple(d(x) for x in _list(b)),
    "~d": lambda b, d, r: dict(_pairs(b, d)),
    "~s": lambda b, d, r: {d(x) for x in _list(b)},
    "~fs": lambda b, d, r: frozenset(d(x) for x in _list(b)),
    "~b": lambda b, d, r: _bytes(b),
    "~ba": lambda b, d, r: bytearray(_bytes(b)),
    "~c": lambda b, d, r: complex(*_fixed(b, 2, _num)),
    "~r": lambda b, d, r: range(*_fixed(b, 3, _int)),
    "~q": lambda b, d, r: _fraction(b),
    "~dec": lambda b, d, r: _decimal(b),
    "~Counter": lambda b, d, r: _counter(b, d),
    "~OrderedDict": lambda b, d, r: _ordered(b, d),
    "~defaultdict": lambda b, d, r: _defaultdict(b, d),
    "~deque": lambda b, d, r: _deque(b, d),
    "~h": lambda b, d, r: _handle(b, r),
}


def decode(v, resolve, depth=0):
    """Wire data -> a value built from builtin constructors only; handles become `resolve(id, type_name)`."""
    import decimal
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    t = type(v)
    if v is None or t in (bool, int, float, str):
        return v
    if t is list:
        return [decode(x, resolve, depth + 1) for x in v]
    if t is not dict or len(v) != 1:
        raise WireError(f"not a wire value: {t.__name__}")
    (tag, body), = v.items()
    if tag not in _TAGS:
        raise WireError(f"unknown tag {tag!r}")
    try:
        return _TAGS[tag](body, lambda x: decode(x, resolve, depth + 1), resolve)
    except WireError:
        raise
    except (TypeError, ValueError, ArithmeticError, RecursionError, decimal.DecimalException) as e:
        raise WireError(f"bad {tag} value: {type(e).__name__}") from None


class Channel:
    """Line-delimited JSON over two pipe fds."""

    MAX_LINE = 256 << 20

    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd, self.wfd = rfd, wfd
        self.buf = bytearray()

    def send(self, obj) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.wfd, view):]
        except (OSError, ValueError) as e:
            raise WireError(f"the other side is gone ({type(e).__name__})") from None

    def recv(self, timeout: float | None = None):
        import select
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        start = 0
        while True:
            nl = self.buf.find(b"\n", start)
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[: nl + 1]
                break
            start = len(self.buf)
            if start > self.MAX_LINE:
                raise WireError("message too long")
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                    raise WireError(f"no answer within {timeout:g} s")
            try:
                chunk = os.read(self.rfd, 1 << 16)
            except OSError as e:
                raise WireError(f"the other side is gone ({type(e).__name__})") from None
            if not chunk:
                raise WireError("the program ended or closed the channel")
            self.buf += chunk
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            raise WireError("unreadable message") from None
        if type(msg) is not dict:
            raise WireError("a message must be an object")
        return msg
