"""`forerun bench gpu-rows`: what one more row costs in a decode step on a GPU, λ = b / a of t(r) ≈ a + b·r.

Streaming PreSTO admits a speculative row for a node worth at least λ (`PrefetchConfig.row_cost`), and
`bench presto --predict-row-cost λ` predicts each variant's speedup at a given λ.  On the embedded CPU engine
λ is measured by `presto.cost_model.step_cost_curve`; where SGLang runs (a GPU) this measures the same curve
with a minimal Llama-family decode step of a model's shapes, run the way a serving engine runs decode:

    notion                                       code
    one decode step of r rows                    `DecodeStep.__call__`: embed -> L x (RMSNorm, fused QKV, RoPE,
                                                 GQA attention over a static KV buffer of `context` tokens per
                                                 row, o-proj, RMSNorm, SiLU-gated MLP) -> norm -> lm_head ->
                                                 log-softmax (log p0) and softmax at α (what the plugin reads)
    t(r)                                         one CUDA-graph replay of that step (SGLang captures its decode
                                                 batches as CUDA graphs): median of `repeats`, timed with CUDA
                                                 events; eager (no graph) beside it.  On a CPU: eager only
    a, b                                         least squares over the rows <= `fit_up_to` (`fit_line`)
    λ = b / a                                    `fit["row_cost"]`

The step is unfused (separate RoPE, norm and softmax kernels; SDPA attention), so its fixed cost a is larger
than a tuned server's and λ = b / a comes out smaller: read it as a lower bound.  The weights are random (the
step's time does not depend on their values), bf16 by default.  This file imports only torch, numpy and the
standard library (both where they are used, so that registering the command keeps `forerun --help` light), so it also
runs where forerun is not installed (a lent GPU machine without network):

    python3 eval/engine_bench/gpu_rows.py --shapes smollm2-135m qwen3-4b --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Shape:
    """A Llama-family model's decode-relevant shapes (from its config.json)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float = 10000.0
    qk_norm: bool = False
    """Qwen3 RMS-normalises q and k per head before RoPE."""
    rms_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.heads % self.kv_heads or self.head_dim % 2:
            raise ValueError("heads must be a multiple of kv_heads and head_dim even")

    def parameters(self) -> int:
        """Weights read per step: every layer's matrices and the (tied) embedding."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return self.layers * (attn + 3 * self.hidden * self.intermediate) + self.vocab * self.hidden


SHAPES = {
    # HuggingFaceTB/SmolLM2-135M-Instruct, the default model
    "smollm2-135m": Shape(hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152,
                          rope_theta=1e5, rms_eps=1e-5),
    # Qwen/Qwen3-4B, the README's SGLang example
    "qwen3-4b": Shape(hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, intermediate=9728, vocab=151936,
                      rope_theta=1e6, qk_norm=True),
    # meta-llama/Llama-3.1-8B-Instruct (its untied lm_head has the embedding's size; RoPE scaling left out)
    "llama3-8b": Shape(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
                       vocab=128256, rope_theta=5e5, rms_eps=1e-5),
}


@dataclass(frozen=True)
class GpuRowsConfig:
    """Settings of `forerun bench gpu-rows`."""

    shapes: tuple[str, ...] = ("smollm2-135m",)
    rows: tuple[int, ...] = (1, 2, 4, 6, 8, 12, 16, 20, 32, 48, 64, 128)
    context: int = 512
    """KV tokens per row (prompt + response so far)."""
    repeats: int = 100
    """Timed steps per row count (median); eager runs a quarter as many."""
    fit_up_to: int = 20
    """Fit t(r) over the rows <= this (N_pf = 20 by default)."""
    device: str = "cuda"
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        unknown = [s for s in self.shapes if s not in SHAPES]
        if not self.shapes or unknown:
            raise ValueError(f"shapes must be among {sorted(SHAPES)}, got {list(self.shapes)}")
        if not self.rows or min(self.rows) < 1:
            raise ValueError(f"rows must be >= 1, got {list(self.rows)}")
        for name in ("context", "repeats", "fit_up_to"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be bfloat16, float16 or float32, got {self.dtype!r}")
        if re.fullmatch(r"cpu|cuda(:[0-9]+)?", self.device) is None:  # torch's RuntimeError for cuda:x was a bug
            raise ValueError(f"device must be cuda[:i] or cpu, got {self.device!r}")


class DecodeStep:
    """One decode step of `rows` rows, each at position `context - 1` with `context - 1` cached tokens before
    it, over random weights of `shape` (module docstring).  Weights and KV are plain tensors, so a test can set
    them from a reference model."""

    def __init__(self, shape: Shape, rows: int, context: int, device: torch.device | str, dtype: torch.dtype,
                 alpha: float = 4.0, seed: int = 0) -> None:
        import torch

        device = torch.device(device)
        g = torch.Generator(device=device).manual_seed(seed)

        def w(*size: int, scale: float = 0.02, base: float = 0.0) -> torch.Tensor:
            return torch.randn(*size, generator=g, device=device, dtype=dtype).mul_(scale).add_(base)

        s = self.shape = shape
        self.alpha = alpha
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.layers = [{"norm1": w(s.hidden, base=1.0), "qkv": w(q + 2 * kv, s.hidden), "o": w(s.hidden, q),
                        "norm2": w(s.hidden, base=1.0), "gate_up": w(2 * s.intermediate, s.hidden),
                        "down": w(s.hidden, s.intermediate), "q_norm": w(s.head_dim, base=1.0),
                        "k_norm": w(s.head_dim, base=1.0)} for _ in range(s.layers)]
        self.embed = w(s.vocab, s.hidden)
        self.final_norm = w(s.hidden, base=1.0)
        self.kv = w(s.layers, 2, rows, s.kv_heads, context, s.head_dim, scale=1.0)
        self.tokens = torch.randint(0, s.vocab, (rows,), generator=g, device=device)
        self.position = context - 1
        inv = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, device=device, dtype=torch.float32) / s.head_dim))
        angle = torch.cat((self.position * inv, self.position * inv))
        self.cos, self.sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * self.cos + rotated * self.sin

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p0, softmax at α) of the next token, [rows, vocab] in float32; writes the step's K and V."""
        import torch
        import torch.nn.functional as F

        s, rows, eps = self.shape, self.tokens.shape[0], self.shape.rms_eps
        q_size, kv_size = s.heads * s.head_dim, s.kv_heads * s.head_dim
        h = self.embed[self.tokens]
        for i, p in enumerate(self.layers):
            x = F.rms_norm(h, (s.hidden,), p["norm1"], eps)
            q, k, v = (x @ p["qkv"].T).split([q_size, kv_size, kv_size], dim=-1)
            q = q.view(rows, s.heads, 1, s.head_dim)
            k = k.view(rows, s.kv_heads, 1, s.head_dim)
            if s.qk_norm:
                q = F.rms_norm(q, (s.head_dim,), p["q_norm"], eps)
                k = F.rms_norm(k, (s.head_dim,), p["k_norm"], eps)
            self.kv[i, 0, :, :, self.position:self.position + 1] = self._rope(k)
            self.kv[i, 1, :, :, self.position:self.position + 1] = v.view(rows, s.kv_heads, 1, s.head_dim)
            a = F.scaled_dot_product_attention(self._rope(q), self.kv[i, 0], self.kv[i, 1], enable_gqa=True)
            h = h + a.reshape(rows, q_size) @ p["o"].T
            x = F.rms_norm(h, (s.hidden,), p["norm2"], eps)
            gate, up = (x @ p["gate_up"].T).chunk(2, dim=-1)
            h = h + (F.silu(gate) * up) @ p["down"].T
        logits = (F.rms_norm(h, (s.hidden,), self.final_norm, eps) @ self.embed.T).float()
        return torch.log_softmax(logits, dim=-1), torch.softmax(logits * self.alpha, dim=-1)


def _median_ms(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    """Median time of one call in milliseconds (CUDA events on a GPU, perf_counter elsewhere)."""
    import torch

    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def step_times(shape: Shape, rows: int, context: int, device: torch.device, dtype: torch.dtype,
               repeats: int) -> dict[str, float]:
    """Eager and (on CUDA) graph-replay milliseconds of one decode step of `rows` rows; `step_ms` is the graph's
    where there is one."""
    import torch

    step = DecodeStep(shape, rows, context, device, dtype)
    with torch.inference_mode():
        for _ in range(3):
            step()
        out = {"rows": rows, "eager_ms": _median_ms(step, max(repeats // 4, 3), device)}
        if device.type == "cuda":
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):  # warm up off the capture stream, as torch's CUDA-graph notes ask
                for _ in range(3):
                    step()
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            for _ in range(10):
                graph.replay()
            out["graph_ms"] = _median_ms(graph.replay, repeats, device)
            del graph
    out["step_ms"] = out.get("graph_ms", out["eager_ms"])
    del step
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def fit_line(points: list[dict[str, float]], up_to: int) -> dict[str, float]:
    """Least squares t(r) = a + b·r (seconds; numpy's polyfit) over the points with rows <= up_to, and λ = b / a
    (b < 0 counts as 0).  With one such point b = 0."""
    import numpy as np

    used = [p for p in points if p["rows"] <= up_to] or points[:1]
    ms = np.array([p["step_ms"] for p in used], dtype=float)
    if len(used) > 1:
        b, a = np.polyfit(np.array([p["rows"] for p in used], dtype=float), ms, 1)
    else:
        b, a = 0.0, float(ms[0])
    return {"a_s": float(a) / 1e3, "b_s": float(b) / 1e3, "row_cost": max(float(b), 0.0) / a if a > 0 else math.nan,
            "rows_up_to": max(p["rows"] for p in used)}


def step_bytes(shape: Shape, rows: int, context: int, itemsize: int) -> int:
    """What one `DecodeStep` holds: the weights, the KV buffer of `rows` x `context` tokens, float32 logits."""
    kv = shape.layers * 2 * rows * shape.kv_heads * context * shape.head_dim
    return itemsize * (shape.parameters() + kv) + 3 * 4 * rows * shape.vocab


def _check_fits(config: GpuRowsConfig, device: torch.device, itemsize: int) -> None:
    """A ValueError, before any step is built, when the largest step cannot fit the device's memory (a huge
    --rows or --context filled the machine's memory, or ended in the allocator's error as an internal error)."""
    import torch

    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    rows = max(config.rows)
    for name in config.shapes:
        need = step_bytes(SHAPES[name], rows, config.context, itemsize)
        if need > total:
            raise ValueError(f"--rows {rows} --context {config.context}: a step of {name} holds "
                             f"{need / 2**30:.1f} GiB (weights and KV cache), more than the {total / 2**30:.1f} "
                             f"GiB of {device}")


def run_gpu_rows(config: GpuRowsConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every shape's t(r) at every row count, its fit and λ; `progress` is told each (shape, rows) once timed."""
    import torch

    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"no CUDA device here (torch {torch.__version__} sees none); --device cpu times the "
                         "same step eagerly on the CPU")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():  # torch's error was a bug's
        raise ValueError(f"no CUDA device {device} here (torch sees {torch.cuda.device_count()})")
    dtype = getattr(torch, config.dtype)
    _check_fits(config, device, dtype.itemsize)
    shapes = []
    for name in config.shapes:
        points = []
        for r in sorted(set(config.rows)):
            points.append(step_times(SHAPES[name], r, config.context, device, dtype, config.repeats))
            if progress:
                progress(f"{name}, {r} rows: {points[-1]['step_ms']:.3f} ms")
        for p in points:
            p["x_one_row"] = p["step_ms"] / points[0]["step_ms"]
        shapes.append({"shape": name, "parameters": SHAPES[name].parameters(), "points": points,
                       "fit": fit_line(points, config.fit_up_to)})
    meta = {**asdict(config), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "timing": "CUDA graph replay" if device.type == "cuda" else "eager"}
    return {"meta": meta, "shapes": shapes}


def format_gpu_rows(result: dict[str, Any]) -> str:
    m = result["meta"]
    lines = [f"decode step against rows — {m['device_name']}, {m['dtype']}, {m['context']} KV tokens per row, "
             f"{m['timing']}, median of {m['repeats']}"]
    for s in result["shapes"]:
        cells = ", ".join(f"{p['rows']}: {p['step_ms']:.3f} ms ({p['x_one_row']:.2f}x)" for p in s["points"])
        f = s["fit"]
        lines.append(f"{s['shape']} ({s['parameters'] / 1e9:.2f}B): {cells}")
        lines.append(f"  t(r) = {1e3 * f['a_s']:.3f} ms + {1e3 * f['b_s']:.4f} ms·r over rows <= {f['rows_up_to']}: "
                     f"λ = b/a = {f['row_cost']:.4f} (bench presto --predict-row-cost / --row-cost)")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `forerun bench gpu-rows` (and of this file run as a script)."""
    d = GpuRowsConfig()
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(d.shapes),
                   help=f"model shapes to time (default {' '.join(d.shapes)})")
    p.add_argument("--rows", type=int, nargs="+", default=list(d.rows), help="row counts (default: 1 to 128)")
    p.add_argument("--context", type=int, default=d.context, help=f"KV tokens per row (default {d.context})")
    p.add_argument("--repeats", type=int, default=d.repeats, help=f"timed steps per row count (default {d.repeats})")
    p.add_argument("--fit-up-to", type=int, default=d.fit_up_to,
                   help=f"fit t(r) = a + b·r over rows <= this (default {d.fit_up_to}, PreSTO's N_pf)")
    p.add_argument("--device", default=d.device, help=f"cuda[:i] or cpu (default {d.device})")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=d.dtype)
    p.add_argument("--json", action="store_true", help="print a JSON object on stdout")


def config_from(args: argparse.Namespace) -> GpuRowsConfig:
    return GpuRowsConfig(shapes=tuple(args.shapes), rows=tuple(args.rows), context=args.context,
                         repeats=args.repeats, fit_up_to=args.fit_up_to, device=args.device, dtype=args.dtype)


def main(argv: list[str] | None = None) -> int:
    """Run as a script (no forerun install needed): one line on stderr and exit 2 on bad input."""
    p = argparse.ArgumentParser(prog="gpu_rows.py", description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        result = run_gpu_rows(config_from(args), progress=lambda what: print(f"gpu_rows: {what}", file=sys.stderr))
    except ValueError as exc:
        print(f"gpu_rows: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else format_gpu_rows(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
