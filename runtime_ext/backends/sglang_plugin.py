"""The forerun sampler plugin for a launched SGLang 0.5.23 server: log p0, the entropy of p0 and log q_τ' at
requested temperatures τ' for every generated token, in the generation pass itself.

The SGLang runtime's sampler plugin; it reaches the runtime (`sglang.srt`, through `sglang_frontend.hook_registry`,
the one sglang import point) only inside `register()`, which SGLang
calls in each of its processes: forerun declares it under the entry-point group `sglang.srt.plugins`
(pyproject.toml), and `srt/plugins/__init__.py` `load_plugins()` runs every installed plugin.  `register()`
does nothing unless FORERUN_SGLANG_PLUGIN=1 (`scripts/launch_runtime --plugin` sets it), so installing forerun
next to a server changes nothing by itself.

    paper                         meta_info key (one entry per generated token)   computed from
    log p0(y_t | ·)               output_token_logp0                              log_softmax(z)[y_t]
    H(p0(· | y_<t))               output_token_entropy                            −Σ p0 log p0 (full vocabulary)
    log q_τ'(y_t | ·), τ' ∈ 𝒯      output_token_logq_by_temperature (|𝒯| values)   log_softmax(z / τ')[y_t]

z are the logits the sampler receives (after SGLang's penalties and logit bias, before temperature,
top-k/top-p and custom logit processors), copied before `Sampler.forward` scales them in place.  A request
switches the plugin on with `sampling_params.custom_params = {"forerun_plugin": true,
"forerun_logq_temperatures": [τ', ...]}` (flat keys: SGLang's CustomParamValue); the values reach the
response through `LogitsProcessorOutput.customized_info` (`batch_result_processor._maybe_collect_customized_info`
takes entry i of each list per step; `tokenizer_manager` surfaces each key in `meta_info`).  Rows that did
not ask get None in a batch that mixes both, and cost nothing in a batch where no row asked.

Hooks (`HookRegistry`):
    Sampler.forward                                  AROUND: copy the asking rows' logits, sample, compute
    SamplingBatchInfo.adjusted_from_schedule_batch   AFTER: keep each row's custom_params (SGLang keeps them
    SamplingBatchInfo.filter_batch / merge_batch     AROUND  only with a custom logit processor)
    sglang.srt.utils.common.build_server_info        AFTER: /server_info gains "forerun_plugin"
Not covered: speculative decoding (its verify step samples elsewhere); the fields are then absent and the
client reports it.  Cost: one device-to-host copy of |rows| × (2 + |𝒯|) floats per step with asking rows.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

PLUGIN_ENV = "FORERUN_SGLANG_PLUGIN"
SWITCH = "forerun_plugin"
TEMPERATURES = "forerun_logq_temperatures"
LOGP0_KEY = "output_token_logp0"
ENTROPY_KEY = "output_token_entropy"
LOGQ_BY_TEMPERATURE_KEY = "output_token_logq_by_temperature"
PLUGIN_INFO = {"version": 1, "keys": [LOGP0_KEY, ENTROPY_KEY, LOGQ_BY_TEMPERATURE_KEY],
               "switch": {SWITCH: True, TEMPERATURES: "list of floats"}}
SAMPLER_FORWARD = "sglang.srt.layers.sampler.Sampler.forward"
BATCH_INFO = "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo"
SERVER_INFO = "sglang.srt.utils.common.build_server_info"


def register() -> None:
    """The `sglang.srt.plugins` entry point: register the hooks when FORERUN_SGLANG_PLUGIN=1."""
    if os.environ.get(PLUGIN_ENV) != "1":
        return
    from .sglang_frontend import hook_registry

    HookRegistry, HookType = hook_registry()

    HookRegistry.register(SAMPLER_FORWARD, sampler_forward_hook, HookType.AROUND)
    HookRegistry.register(f"{BATCH_INFO}.adjusted_from_schedule_batch", keep_custom_params, HookType.AFTER)
    HookRegistry.register(f"{BATCH_INFO}.filter_batch", filter_custom_params, HookType.AROUND)
    HookRegistry.register(f"{BATCH_INFO}.merge_batch", merge_custom_params, HookType.AROUND)
    HookRegistry.register(SERVER_INFO, announce_plugin, HookType.AFTER)


# -- which rows asked ---------------------------------------------------------------------------
def row_request(custom_params: Any) -> tuple[float, ...] | None:
    """The temperatures τ' a row asked for (possibly none), or None when it did not switch the plugin on."""
    if not isinstance(custom_params, dict) or not custom_params.get(SWITCH):
        return None
    temps = custom_params.get(TEMPERATURES) or ()
    return tuple(float(t) for t in temps)


def asking_rows(custom_params: Sequence[Any] | None) -> list[tuple[int, tuple[float, ...]]]:
    """(row, τ' tuple) of every row that switched the plugin on."""
    if not custom_params:
        return []
    rows = [(i, row_request(p)) for i, p in enumerate(custom_params)]
    return [(i, t) for i, t in rows if t is not None]


def keep_custom_params(result: Any, info: Any, batch: Any, vocab_size: int) -> None:
    """AFTER SamplingBatchInfo.adjusted_from_schedule_batch: keep every row's custom_params when one asked."""
    if info.custom_params is None:
        params = [r.sampling_params.custom_params for r in batch.reqs]
        if asking_rows(params):
            info.custom_params = params


def filter_custom_params(original: Any, info: Any, keep_indices: Sequence[int], *args: Any, **kwargs: Any) -> Any:
    """AROUND SamplingBatchInfo.filter_batch: the kept rows keep their custom_params."""
    before = list(info.custom_params) if info.custom_params is not None else None
    out = original(info, keep_indices, *args, **kwargs)
    if before is not None and asking_rows(before):
        info.custom_params = [before[i] for i in keep_indices]
    return out


def merge_custom_params(original: Any, info: Any, other: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND SamplingBatchInfo.merge_batch: the merged rows keep their custom_params, in order."""
    a = list(info.custom_params) if info.custom_params is not None else None
    b = list(other.custom_params) if other.custom_params is not None else None
    la, lb = len(info), len(other)
    out = original(info, other, *args, **kwargs)
    if asking_rows(a) or asking_rows(b):
        info.custom_params = (a or [None] * la) + (b or [None] * lb)
    return out


def announce_plugin(result: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """AFTER build_server_info: /server_info tells clients the plugin runs."""
    result["forerun_plugin"] = dict(PLUGIN_INFO)
    return result


# -- the fields ---------------------------------------------------------------------------------
def sampler_fields(raw_logits: torch.Tensor, token_ids: torch.Tensor,
                   temperatures: Sequence[Sequence[float]]) -> dict[str, list[Any]]:
    """Per asking row: log p0 and entropy of p0 at the sampled token, and log q_τ' for the row's τ'.

    raw_logits: (rows, vocab) logits before temperature; token_ids: (rows,) sampled ids."""
    z = raw_logits.float()
    logp0 = torch.log_softmax(z, dim=-1)
    p0 = logp0.exp()
    entropy = -torch.where(p0 > 0, p0 * logp0, torch.zeros_like(p0)).sum(dim=-1)
    tok = token_ids.long().view(-1, 1)
    picked = logp0.gather(1, tok).view(-1)
    by_temp: list[list[float]] = []
    for r, temps in enumerate(temperatures):
        vals = [torch.log_softmax(z[r] / t, dim=-1)[tok[r, 0]] for t in temps]
        by_temp.append(torch.stack(vals).tolist() if vals else [])
    return {LOGP0_KEY: picked.tolist(), ENTROPY_KEY: entropy.tolist(), LOGQ_BY_TEMPERATURE_KEY: by_temp}


def attach(logits_output: Any, n_rows: int, rows: Sequence[int], fields: dict[str, list[Any]]) -> None:
    """Put the fields in `customized_info` (one list entry per batch row; None for rows that did not ask)."""
    info = dict(logits_output.customized_info or {})
    for key, values in fields.items():
        column: list[Any] = [None] * n_rows
        for row, value in zip(rows, values):
            column[row] = value
        info[key] = column
    logits_output.customized_info = info


def sampler_forward_hook(original: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND Sampler.forward(self, logits_output, sampling_info, ...)."""
    logits_output = args[1] if len(args) > 1 else kwargs["logits_output"]
    sampling_info = args[2] if len(args) > 2 else kwargs["sampling_info"]
    logits = logits_output.next_token_logits
    asking = asking_rows(getattr(sampling_info, "custom_params", None))
    if not asking or logits is None or logits.shape[0] != len(sampling_info.custom_params):
        return original(*args, **kwargs)
    rows = [i for i, _ in asking]
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    raw = logits.index_select(0, index)  # a copy: the sampler divides and softmaxes the logits in place
    token_ids = original(*args, **kwargs)
    fields = sampler_fields(raw, token_ids.index_select(0, index), [t for _, t in asking])
    attach(logits_output, logits.shape[0], rows, fields)
    return token_ids
