"""Launch SGLang 0.5.23 servers for forerun, and optionally the SGLang Model Gateway in front of them
(`scripts/launch_runtime`; `python -m forerun.runtime_ext.launch --help`).

    scripts/launch_runtime [--model-path M] [--port P] [--host H] [--timeout S] [--log FILE]
                           [--workers N [--gateway]] [--plugin] [--no-deterministic] [--foreground]
                           [-- EXTRA SGLANG ARGS...]

One server: `python -m sglang.launch_server --model-path M --host H --port P --enable-metrics
--enable-deterministic-inference` + the extra args; it waits until GET /health answers 200 and prints the URL.
`--workers N` starts N servers (ports P+1..P+N with --gateway, else P..P+N-1); `--gateway` starts `smg launch`
(the SGLang Model Gateway, PyPI `smg`) on port P in front of them with sticky routing (`--policy manual
--assignment-mode min_group`: every request carrying one `X-SMG-Routing-Key` goes to one worker, a new key to
the worker with the fewest keys in flight) and prints the gateway URL, which `forerun ... --backend URL` uses
like a single server: each chain sends a key of its own (`runtime_ext.pool`).

Flags SGLang needs and no others:
* `--enable-deterministic-inference` (default on): SGLang honours `sampling_seed` only then
  (`srt/sampling/sampling_batch_info.py`), and it is also its batch-invariant mode; without it sequential and
  PreSTO chains differ.  `--no-deterministic` leaves it off (forerun then refuses seeded work unless
  `--allow-nondeterministic`).
* `--mem-fraction-static` when several servers share one GPU: each gets 0.8 / (servers on that GPU) of its
  memory for weights + KV unless the extra args set it (then the sum must stay below 0.95); server i runs on
  GPU i mod G (CUDA_VISIBLE_DEVICES).  One server per GPU keeps SGLang's own default.
* not `--enable-session-radix-cache`: sessions do not need it; it forces the Python radix tree and aborts
  together with other cache options.

The interpreter that runs the servers is the first of $PYTHON, this Python, `python3` on PATH that has the
SGLang runtime (sglang, torch, triton, orjson and uvloop importable: triton alone also comes with xgrammar); with none, one line on stderr and exit 2.
FORERUN_SERVER_MODULE runs another module instead of sglang.launch_server (tests and the scale-out benchmark:
the stand-in server `forerun.runtime_ext.standin.server`), with no runtime check.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
RUNTIME_MODULES = ("sglang", "torch", "triton", "orjson", "uvloop")
"""What the SGLang server imports beyond forerun's own dependencies (triton alone is no sign: xgrammar brings it)."""
MEM_FRACTION_PER_GPU = 0.8
"""Static memory (weights + KV pool) of all servers that share one GPU, as a fraction of its memory."""
GATEWAY_POLICY = ("--policy", "manual", "--assignment-mode", "min_group")
"""smg's sticky routing: one routing key -> one worker; a new key -> the worker with the fewest keys in flight."""


class LaunchError(Exception):
    """Something is missing or failed; the message is the one line the user sees (exit code `code`)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Launched:
    """A started process: its pid, URL and log file."""

    pid: int
    url: str
    log: Path


def has_runtime(python: str) -> bool:
    """Whether `python` can import the SGLang runtime (RUNTIME_MODULES)."""
    probe = "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in %r))" % (RUNTIME_MODULES,)
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def runtime_interpreter(candidates: Sequence[str | None]) -> str:
    """The first candidate interpreter with the SGLang runtime; `LaunchError` (exit 2) when none has it."""
    tried = [c for c in dict.fromkeys(c for c in candidates if c)]
    for python in tried:
        if has_runtime(python):
            return python
    raise LaunchError("the SGLang runtime (sglang, torch, triton, orjson, uvloop) is not installed for any of "
                      f"{', '.join(tried)}: on a GPU machine run FORERUN_GPU=1 scripts/setup (it installs "
                      "sglang==0.5.23 with its pinned dependencies into .venv), or set PYTHON=/path/to/python", code=2)


def gpu_count() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else the lines of `nvidia-smi -L`, else 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def mem_fraction_static(workers: int, gpus: int, extra: Sequence[str]) -> float | None:
    """The `--mem-fraction-static` each of `workers` servers on `gpus` GPUs needs; None when every server has a
    GPU of its own (SGLang's default) or the extra args set it (checked: the servers on one GPU must fit)."""
    per_gpu = math.ceil(workers / gpus) if gpus else 1
    given = _flag_value(extra, "--mem-fraction-static")
    if given is not None:
        try:
            value = float(given)
        except ValueError:
            raise LaunchError(f"--mem-fraction-static must be a number, got {given!r}") from None
        if per_gpu * value > 0.95:
            raise LaunchError(f"--mem-fraction-static {value:g} × {per_gpu} servers on one GPU = "
                              f"{per_gpu * value:.2f} > 0.95 of its memory: lower it or use fewer --workers")
        return None
    if per_gpu <= 1:
        return None
    return math.floor(MEM_FRACTION_PER_GPU / per_gpu * 100) / 100


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def answers(url: str, path: str = "/health", timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url + path, timeout=timeout) as resp:
            return resp.status == 200
    except Exception:
        return False


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _log_tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float, ready: str = "/health") -> None:
    """Poll `url + ready` until 200; `LaunchError` when the process exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise LaunchError(f"{url}: the process exited before becoming healthy; last lines of {log}:\n"
                              f"{_log_tail(log)}")
        if answers(url, ready):
            return
        if time.monotonic() >= deadline:
            proc.kill()
            raise LaunchError(f"{url}{ready} did not answer 200 within {timeout:g}s; stopped pid {proc.pid}. "
                              f"Last lines of {log}:\n{_log_tail(log)}")
        time.sleep(0.5)


def start_process(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `argv` detached from our terminal's Ctrl-C (its own session), output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)


def server_argv(python: str, module: str, model: str, host: str, port: int, deterministic: bool,
                mem_fraction: float | None, extra: Sequence[str]) -> list[str]:
    argv = [python, "-m", module, "--model-path", model, "--host", host, "--port", str(port), "--enable-metrics"]
    if deterministic:
        argv.append("--enable-deterministic-inference")
    if mem_fraction is not None:
        argv += ["--mem-fraction-static", f"{mem_fraction:g}"]
    return argv + list(extra)


def smg_binary() -> str:
    """The `smg` executable beside this Python (the venv's) or on PATH; `LaunchError` (exit 2) otherwise."""
    here = Path(sys.executable).with_name("smg")
    found = str(here) if here.is_file() else shutil.which("smg")
    if not found:
        raise LaunchError("--gateway needs the SGLang Model Gateway: pip install smg (PyPI; installs in seconds, "
                          "no GPU needed)", code=2)
    return found


def gateway_ready(url: str, workers: int) -> bool:
    """The gateway answers and lists `workers` healthy workers (GET /workers)."""
    import json

    try:
        with urllib.request.urlopen(url + "/workers", timeout=2) as resp:
            listed = json.loads(resp.read()).get("workers", [])
    except Exception:
        return False
    return sum(1 for w in listed if w.get("is_healthy")) >= workers


def launch_gateway(host: str, port: int, worker_urls: Sequence[str], log: Path, timeout: float) -> Launched:
    """`smg launch` on host:port in front of `worker_urls` with sticky routing (`GATEWAY_POLICY`)."""
    if not port_is_free(host, port):
        raise LaunchError(f"port {port} is taken; pick another --port")
    metrics_port = free_port(host)
    argv = [smg_binary(), "launch", "--host", host, "--port", str(port), "--worker-urls", *worker_urls,
            *GATEWAY_POLICY, "--prometheus-host", host, "--prometheus-port", str(metrics_port),
            "--log-level", "warn"]
    print(f"launch_runtime: {' '.join(argv)}", file=sys.stderr)
    proc = start_process(argv, log)
    url = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout
    try:
        while not gateway_ready(url, len(worker_urls)):
            if proc.poll() is not None:
                raise LaunchError(f"the gateway exited before becoming ready; last lines of {log}:\n{_log_tail(log)}")
            if time.monotonic() >= deadline:
                raise LaunchError(f"the gateway {url} did not list {len(worker_urls)} healthy workers within "
                                  f"{timeout:g}s; last lines of {log}:\n{_log_tail(log)}")
            time.sleep(0.3)
    except BaseException:  # a timeout or Ctrl-C while it starts: no gateway left behind (its own session)
        _stop(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return Launched(proc.pid, url, log)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="launch_runtime", allow_abbrev=False,
                                description="Launch SGLang servers (and the SGLang Model Gateway) for forerun.")
    p.add_argument("--model-path", default=os.environ.get("FORERUN_SGLANG_MODEL", DEFAULT_MODEL))
    p.add_argument("--port", default="30000", help="server port (with --gateway: the gateway's; workers follow it)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--timeout", default="600", help="seconds to wait for each server to be healthy (600)")
    p.add_argument("--log", default=None, help="log file (several servers: FILE.0, FILE.1, ...; the gateway FILE.gw)")
    p.add_argument("--workers", default="1", help="number of SGLang servers (1)")
    p.add_argument("--gateway", action="store_true", help="start the SGLang Model Gateway (smg) in front of them")
    p.add_argument("--plugin", action="store_true", help="run the forerun sampler plugin (FORERUN_SGLANG_PLUGIN=1)")
    p.add_argument("--no-deterministic", action="store_true", help="leave --enable-deterministic-inference off")
    p.add_argument("--foreground", action="store_true", help="wait on the servers (Ctrl-C stops them)")
    args, extra = p.parse_known_args(argv)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    for name in ("port", "timeout", "workers"):
        value = getattr(args, name)
        if not value.isdigit():
            raise LaunchError(f"--{name} must be a number (whole), got '{value}'")
        setattr(args, name, int(value))
    if args.workers < 1:
        raise LaunchError("--workers must be >= 1")
    if not args.model_path:
        raise LaunchError("--model-path is empty")
    return args, [e for e in extra if e != "--"]


def launch(args: argparse.Namespace, extra: list[str], module: str | None = None) -> tuple[list[Launched], Launched | None]:
    """Start the servers (and the gateway); return them once healthy (all stopped again on a failure).
    `module` (else FORERUN_SERVER_MODULE, else sglang.launch_server) is what each server runs."""
    module = module or os.environ.get("FORERUN_SERVER_MODULE", "sglang.launch_server")
    real = module == "sglang.launch_server"
    python = runtime_interpreter([os.environ.get("PYTHON"), sys.executable, shutil.which("python3")]) if real \
        else (os.environ.get("PYTHON") or sys.executable)
    if args.gateway:
        smg_binary()  # missing smg is found before any server starts
    gpus = gpu_count() if real else 0
    mem = mem_fraction_static(args.workers, gpus, extra)
    env = dict(os.environ)
    if args.plugin:
        env["FORERUN_SGLANG_PLUGIN"] = "1"
    else:
        env.pop("FORERUN_SGLANG_PLUGIN", None)
    if args.no_deterministic:
        print("launch_runtime: --enable-deterministic-inference OFF: SGLang ignores sampling_seed, so chains are "
              "equal in law only (forerun refuses seeded work unless --allow-nondeterministic)", file=sys.stderr)
    else:
        print("launch_runtime: --enable-deterministic-inference on: SGLang honours sampling_seed only in this mode "
              "(its batch-invariant mode), which keeps sequential and PreSTO chains identical", file=sys.stderr)
    first = args.port + 1 if args.gateway else args.port
    base_log = Path(args.log) if args.log else Path(tempfile.gettempdir()) / f"forerun-sglang-{args.port}.log"
    started: list[Launched] = []
    procs: list[subprocess.Popen] = []
    try:
        for i in range(args.workers):
            port = first + i
            url = f"http://{args.host}:{port}"
            if answers(url) or not port_is_free(args.host, port):
                raise LaunchError(f"something already listens on {url}; pick another --port")
            log = base_log if args.workers == 1 else base_log.with_name(f"{base_log.name}.{i}")
            argv = server_argv(python, module, args.model_path, args.host, port, not args.no_deterministic, mem, extra)
            wenv = dict(env, CUDA_VISIBLE_DEVICES=_gpu_of(i, gpus, env)) if gpus else env
            print(f"launch_runtime: {'FORERUN_SGLANG_PLUGIN=1 ' if args.plugin else ''}{' '.join(argv)}",
                  file=sys.stderr)
            procs.append(start_process(argv, log, wenv))
            started.append(Launched(procs[-1].pid, url, log))
        for proc, srv in zip(procs, started):
            wait_healthy(proc, srv.url, srv.log, args.timeout)
            print(f"launch_runtime: healthy (pid {srv.pid}, log {srv.log})", file=sys.stderr)
        gateway = launch_gateway(args.host, args.port, [s.url for s in started],
                                 base_log.with_name(base_log.name + ".gw"), args.timeout) if args.gateway else None
        if gateway is not None:
            print(f"launch_runtime: gateway healthy (pid {gateway.pid}, log {gateway.log}), "
                  f"{args.workers} worker(s), sticky routing by X-SMG-Routing-Key", file=sys.stderr)
        return started, gateway
    except BaseException:
        for proc in procs:
            _stop(proc.pid)
        raise


def _gpu_of(i: int, gpus: int, env: dict[str, str]) -> str:
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    ids = visible or [str(k) for k in range(gpus)]
    return ids[i % len(ids)]


def stop(launched: Sequence[Launched], grace_s: float = 5.0) -> None:
    """SIGTERM each launched process group (servers, gateway); SIGKILL what is still alive after `grace_s`."""
    for item in launched:
        _stop(item.pid)
    deadline = time.monotonic() + grace_s
    while any(_alive(item.pid) for item in launched) and time.monotonic() < deadline:
        time.sleep(0.1)
    for item in launched:
        if _alive(item.pid):
            _stop(item.pid, signal.SIGKILL)


def _stop(pid: int, sig: int = signal.SIGTERM) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args, extra = parse_args(argv)
        servers, gateway = launch(args, extra)
    except LaunchError as e:
        print(f"launch_runtime: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("launch_runtime: interrupted", file=sys.stderr)
        return 130
    print(gateway.url if gateway is not None else ",".join(s.url for s in servers), flush=True)
    if args.foreground:
        pids = [s.pid for s in servers] + ([gateway.pid] if gateway else [])
        try:
            while all(_alive(p) for p in pids):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        for pid in pids:
            _stop(pid)
        return 130
    return 0


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a child that exited is reaped here)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass  # not our child
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
