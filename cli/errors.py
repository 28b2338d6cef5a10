"""How a `forerun` command ends: one exit-code table that every command follows, and one line on stderr.

    exit  meaning                                                 stderr
    0     ok                                                      (progress bars only)
    1     failure: the engine or server failed (EngineError), an  "forerun <command>: <message>"
          eval item failed after retries, chains that should be   ("internal error: <Type>: ..." for a bug)
          identical differ, or a bug
    2     usage: bad input (a rejected option or combination, a   "forerun <command>: <message>" (argparse:
          file that is missing, unreadable or not UTF-8, ...),    "forerun <command>: error: ... (see --help)")
          found before any model loads where it can be
    130   interrupted (SIGINT, Ctrl-C)                            "forerun: interrupted"
    143   terminated (SIGTERM: a scheduler's, `timeout`'s)        "forerun: terminated"

Usage errors are ValueError (CommandError), OSError and KeyError; EngineError is a failure (exit 1) in every
command.  FORERUN_TRACEBACK=1 lets every exception through with its traceback (for debugging).

On SIGINT or SIGTERM the command's own `finally` blocks still run (the records file is closed after whole lines,
the engine stops after its current step, launched servers are stopped); then output from other threads (SGLang's
fork threads, tqdm, the engine worker) is silenced and the process leaves with `os._exit(130)` (143 after
SIGTERM), so no thread can print a traceback or keep the interpreter waiting.  A second signal exits at once, and
so does an unwind still running after UNWIND_LIMIT_S.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator, TextIO

from ..runtime_ext.protocol import EngineError

__all__ = ["CommandError", "one_line", "exit_code_for", "report", "reports_errors", "run_guarded", "interrupt_exits",
           "INTERRUPTED_MESSAGE", "EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_INTERRUPTED", "EXIT_TERMINATED"]

Handler = Callable[[Any], Any]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143
"""The exit-code table of the module docstring."""
INTERRUPTED_MESSAGE = "forerun: interrupted"
TRACEBACK_ENV = "FORERUN_TRACEBACK"


class CommandError(ValueError):
    """Bad input found by a command itself (reported as one line, exit 2)."""


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (KeyError's quotes removed)."""
    text = exc.args[0] if isinstance(exc, KeyError) and len(exc.args) == 1 else exc
    return " ".join(str(text).split()) or type(exc).__name__


_WRITE_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EPIPE)
"""OSErrors of a write that failed under a valid command (a full disk, a closed pipe): failures, not usage."""


def exit_code_for(exc: BaseException) -> int:
    """EXIT_FAILURE for an engine or server failure or a write the system refused, EXIT_USAGE for bad input (the
    table above)."""
    if isinstance(exc, EngineError) or isinstance(exc, OSError) and exc.errno in _WRITE_FAILURES:
        return EXIT_FAILURE
    return EXIT_USAGE


def report(command: str, exc: BaseException) -> int:
    """Print the one-line error of `command` and return its exit code (the table above).  A closed stdout (the
    reader of a pipe went away) ends the command quietly, as other command-line tools do."""
    if isinstance(exc, BrokenPipeError):
        try:  # the interpreter's own flush at exit would complain about the closed pipe
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_FAILURE
    if isinstance(exc, (ValueError, OSError, KeyError, EngineError)):
        message, default = one_line(exc), exit_code_for(exc)
    else:
        message = (f"internal error: {type(exc).__name__}: {one_line(exc)} "
                   f"({TRACEBACK_ENV}=1 shows the traceback)")
        default = EXIT_FAILURE
    print(f"forerun {command}: {message}", file=sys.stderr, flush=True)
    return default


def reports_errors(command: str) -> Callable[[Handler], Handler]:
    """Decorate a command handler: an exception becomes its one-line report and exit code (`report`)."""
    def wrap(fn: Handler) -> Handler:
        @functools.wraps(fn)
        def handler(args: Any) -> int:
            try:
                return int(fn(args) or 0)
            except Exception as exc:  # noqa: BLE001 - the command's boundary: one line, never a traceback
                if os.environ.get(TRACEBACK_ENV):
                    raise
                return report(command, exc)
        return handler
    return wrap


# -- SIGINT, SIGTERM --------------------------------------------------------------------------------------
_real_stderr: TextIO | None = None
_terminated = False
"""The signal that ends the command is SIGTERM (exit 143, "terminated"), not SIGINT."""


def _silence_other_output() -> None:
    """After an interrupt, what other threads print (warnings, thread tracebacks) goes nowhere."""
    global _real_stderr
    if _real_stderr is None:
        _real_stderr = sys.stderr
        sys.stderr = open(os.devnull, "w")
        threading.excepthook = lambda args: None


UNWIND_LIMIT_S = 15.0
"""How long a command may unwind after SIGINT / SIGTERM (its `finally` blocks) before the process leaves anyway."""
_leaving = threading.Lock()


def _exit_interrupted(hint: str = "") -> None:
    if not _leaving.acquire(blocking=False):  # another thread is leaving: it ends the process
        while True:
            time.sleep(1)
    stream = _real_stderr or sys.stderr
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    try:
        message = "forerun: terminated" if _terminated else INTERRUPTED_MESSAGE
        stream.write("\r" + message + (f"; {hint}" if hint else "") + "\n")  # \r: after a bar's frame
        stream.flush()
    finally:
        os._exit(EXIT_TERMINATED if _terminated else EXIT_INTERRUPTED)


def _on_signal(signum: int, frame: Any) -> None:
    """SIGINT and SIGTERM: unwind the command (its `finally` blocks run), then `run_guarded` exits."""
    global _terminated
    if _real_stderr is not None:  # the second signal: leave now
        _exit_interrupted()
    _terminated = signum == signal.SIGTERM
    _silence_other_output()
    watchdog = threading.Timer(UNWIND_LIMIT_S, _exit_interrupted)  # an unwind that hangs still ends
    watchdog.daemon = True
    watchdog.start()
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupt_exits() -> Iterator[None]:
    """While the command line starts (its modules import, its arguments parse), a Ctrl-C exits as one during a
    command does - "forerun: interrupted", 130 - instead of a KeyboardInterrupt traceback from an import."""
    previous = (signal.signal(signal.SIGINT, lambda signum, frame: _exit_interrupted())
                if threading.current_thread() is threading.main_thread() else None)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def run_guarded(command: str, handler: Callable[[], int | None]) -> int:
    """Run a command handler under the rules in the module docstring; returns its exit code."""
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        return int(handler() or 0)
    except KeyboardInterrupt as exc:  # a command may re-raise it with a hint: KeyboardInterrupt("rerun with ...")
        _silence_other_output()
        _exit_interrupted(one_line(exc) if exc.args else "")
        raise  # pragma: no cover - _exit_interrupted does not return
    except Exception as exc:  # noqa: BLE001 - the command line's boundary: one line, never a traceback
        if os.environ.get(TRACEBACK_ENV):
            raise
        return report(command, exc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
