"""The forerun sampler plugin for a launched SGLang 0.5.23 server: log p0, the entropy of p0 and log q_τ' at
requested temperatures τ' for every generated token, in the generation pass itself.

The SGLang runtime's sampler plugin; it reaches the runtime (`sglang.srt`, through `sglang_frontend.hook_registry`,
the one sglang import point) only inside `register()`, which SGLang calls in each of its processes: forerun
declares it under the entry-point group `sglang.srt.plugins` (pyproject.toml), and `srt/plugins/__init__.py`
`load_plugins()` runs every installed plugin.  `register()` does nothing unless FORERUN_SGLANG_PLUGIN=1
(`scripts/launch_runtime --plugin` sets it), so installing forerun next to a server changes nothing by itself.

    paper                         meta_info key (one entry per generated token)   computed from
    log p0(y_t | ·)               output_token_logp0                              log_softmax(z)[y_t]
    H(p0(· | y_<t))               output_token_entropy                            −Σ p0 log p0 (full vocabulary)
    log q_τ'(y_t | ·), τ' ∈ 𝒯      output_token_logq_by_temperature (|𝒯| values)   log_softmax(z / τ')[y_t]

z are the logits the sampler receives (after SGLang's penalties and logit bias, before temperature,
top-k/top-p and custom logit processors), copied before `Sampler.forward` scales them in place.  A request
switches the plugin on with `sampling_params.custom_params = {"forerun_plugin": true,
"forerun_logq_temperatures": [τ', ...]}` (flat keys: SGLang's CustomParamValue); the values reach the
response through `LogitsProcessorOutput.customized_info`, one list entry per batch row per step
(`batch_result_processor._maybe_collect_customized_info` appends entry i to request i; the output streamer and
`tokenizer_manager.update_request_meta_info` surface every key in `meta_info`).

Only the requests that asked get the keys.  SGLang would give every request of a batch every key of the step
(entry i, or `[None] * len` padding in the output streamer), so two hooks drop the plugin's keys for a request
that did not switch it on: where the scheduler collects them, and where the tokenizer manager writes meta_info
(the one place every key reaches `meta_info`).  Another client's meta_info is exactly what it would be without
the plugin.

Cost per decode step with asking rows: one batched computation on the device over all asking rows and all
(row, τ') pairs, and one device-to-host copy of |rows| × 2 + Σ|𝒯| floats; no Python loop over requests and no
per-request sync.  Which rows ask (`AskingRows`) is worked out when the batch changes (built, filtered, merged),
not per step.  A batch where no row asked costs nothing.

Hooks (`HookRegistry`):
    Sampler.forward                                  AROUND: copy the asking rows' logits, sample, compute
    SamplingBatchInfo.adjusted_from_schedule_batch   AFTER: keep each row's custom_params as `AskingRows`
    SamplingBatchInfo.filter_batch / merge_batch     AROUND  (SGLang keeps them only with a custom logit processor)
    SchedulerBatchResultProcessor._maybe_collect_    AROUND: a request that did not ask keeps no plugin key
        customized_info
    TokenizerManager.update_request_meta_info        AROUND: nor does its meta_info
    sglang.srt.utils.common.build_server_info        AFTER: /server_info gains "forerun_plugin"
Not covered: speculative decoding (its verify step samples elsewhere); the fields are then absent and the
client reports it.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, NamedTuple, Sequence

import torch

PLUGIN_ENV = "FORERUN_SGLANG_PLUGIN"
SWITCH = "forerun_plugin"
TEMPERATURES = "forerun_logq_temperatures"
LOGP0_KEY = "output_token_logp0"
ENTROPY_KEY = "output_token_entropy"
LOGQ_BY_TEMPERATURE_KEY = "output_token_logq_by_temperature"
PLUGIN_KEYS = (LOGP0_KEY, ENTROPY_KEY, LOGQ_BY_TEMPERATURE_KEY)
PLUGIN_INFO = {"version": 2, "keys": list(PLUGIN_KEYS), "switch": {SWITCH: True, TEMPERATURES: "list of floats"}}
SAMPLER_FORWARD = "sglang.srt.layers.sampler.Sampler.forward"
BATCH_INFO = "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo"
COLLECT = ("sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
           "._maybe_collect_customized_info")
META_INFO = "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info"
SERVER_INFO = "sglang.srt.utils.common.build_server_info"


def register() -> None:
    """The `sglang.srt.plugins` entry point: register the hooks when FORERUN_SGLANG_PLUGIN=1."""
    if os.environ.get(PLUGIN_ENV) != "1":
        return
    # not at module level: every SGLang process loads this entry point, and importing the frontend there
    # (sglang.lang, the stub check) is only wanted when the plugin is switched on; no import circle
    from .sglang_frontend import hook_registry

    HookRegistry, HookType = hook_registry()

    HookRegistry.register(SAMPLER_FORWARD, sampler_forward_hook, HookType.AROUND)
    HookRegistry.register(f"{BATCH_INFO}.adjusted_from_schedule_batch", keep_custom_params, HookType.AFTER)
    HookRegistry.register(f"{BATCH_INFO}.filter_batch", filter_custom_params, HookType.AROUND)
    HookRegistry.register(f"{BATCH_INFO}.merge_batch", merge_custom_params, HookType.AROUND)
    HookRegistry.register(COLLECT, collect_for_asking_requests, HookType.AROUND)
    HookRegistry.register(META_INFO, meta_info_for_asking_requests, HookType.AROUND)
    HookRegistry.register(SERVER_INFO, announce_plugin, HookType.AFTER)


# -- which rows asked ---------------------------------------------------------------------------
def asked(custom_params: Any) -> bool:
    """Whether a request's custom_params switch the plugin on."""
    return isinstance(custom_params, dict) and bool(custom_params.get(SWITCH))


def row_request(custom_params: Any) -> tuple[float, ...] | None:
    """The temperatures τ' a row asked for (possibly none), or None when it did not switch the plugin on."""
    if not asked(custom_params):
        return None
    return tuple(float(t) for t in custom_params.get(TEMPERATURES) or ())


class _DeviceRows(NamedTuple):
    rows: torch.Tensor
    """(k,) the asking rows of the batch."""
    pair_rows: torch.Tensor
    """(P,) for each (row, τ') pair, the position of its row among the asking rows."""
    pair_temperatures: torch.Tensor
    """(P,) τ' of each pair (float32)."""


class AskingRows(list):
    """A batch's custom_params (one entry per row) when at least one row switched the plugin on, with what the
    sampler hook needs per step worked out once: a list, so SGLang uses it as its own custom_params, and
    `SamplingBatchInfo.copy_for_forward` (dataclasses.replace) hands the same object to the forward batch."""

    def __init__(self, params: Iterable[Any]) -> None:
        super().__init__(params)
        asking = [(i, t) for i, t in ((i, row_request(p)) for i, p in enumerate(self)) if t is not None]
        self.rows = tuple(i for i, _ in asking)
        """Batch rows that asked, in order (k of them)."""
        self.temperatures = tuple(t for _, t in asking)
        """τ' tuple of each asking row."""
        self.every_row = len(self.rows) == len(self)
        self.width = max((len(t) for t in self.temperatures), default=0)
        """Columns of the by-temperature table: the most τ' any row asked for."""
        pairs = [(j, slot, t) for j, temps in enumerate(self.temperatures) for slot, t in enumerate(temps)]
        self._pair_rows = [j for j, _, _ in pairs]
        self._pair_temperatures = [t for _, _, t in pairs]
        rows_cpu = torch.tensor(self.rows, dtype=torch.long)
        self.rows_cpu = rows_cpu
        self.pair_cells = (rows_cpu[torch.tensor(self._pair_rows, dtype=torch.long)],
                           torch.tensor([s for _, s, _ in pairs], dtype=torch.long))
        """(batch row, column) of each pair in the by-temperature table."""
        self.short_rows = tuple((r, len(t)) for r, t in zip(self.rows, self.temperatures) if len(t) < self.width)
        """Asking rows with fewer τ' than `width` (their table row is cut to length)."""
        self._on: dict[torch.device, _DeviceRows] = {}

    def on(self, device: torch.device) -> _DeviceRows:
        """The index tensors on `device` (copied there once per batch composition)."""
        found = self._on.get(device)
        if found is None:
            found = self._on[device] = _DeviceRows(
                self.rows_cpu.to(device), torch.tensor(self._pair_rows, dtype=torch.long, device=device),
                torch.tensor(self._pair_temperatures, dtype=torch.float32, device=device))
        return found


def asking_rows(custom_params: Sequence[Any] | None) -> AskingRows | None:
    """`AskingRows` of a batch's custom_params, or None when no row switched the plugin on."""
    if not custom_params:
        return None
    plan = custom_params if isinstance(custom_params, AskingRows) else AskingRows(custom_params)
    return plan if plan.rows else None


def keep_custom_params(result: Any, info: Any, batch: Any, vocab_size: int) -> None:
    """AFTER SamplingBatchInfo.adjusted_from_schedule_batch: keep every row's custom_params when one asked."""
    params = info.custom_params if info.custom_params is not None else [r.sampling_params.custom_params
                                                                        for r in batch.reqs]
    plan = asking_rows(params)
    if plan is not None:
        info.custom_params = plan


def filter_custom_params(original: Any, info: Any, keep_indices: Sequence[int], *args: Any, **kwargs: Any) -> Any:
    """AROUND SamplingBatchInfo.filter_batch: the kept rows keep their custom_params."""
    before = info.custom_params if isinstance(info.custom_params, AskingRows) else None
    out = original(info, keep_indices, *args, **kwargs)
    if before is not None:
        info.custom_params = asking_rows([before[i] for i in keep_indices])
    return out


def merge_custom_params(original: Any, info: Any, other: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND SamplingBatchInfo.merge_batch: the merged rows keep their custom_params, in order."""
    a = list(info.custom_params) if info.custom_params is not None else None
    b = list(other.custom_params) if other.custom_params is not None else None
    la, lb = len(info), len(other)
    if isinstance(info.custom_params, AskingRows):
        info.custom_params = list(a)  # SGLang extends it in place; a forward batch in flight may hold ours
    out = original(info, other, *args, **kwargs)
    if asking_rows(a) is not None or asking_rows(b) is not None:
        info.custom_params = asking_rows((a or [None] * la) + (b or [None] * lb))
    return out


def collect_for_asking_requests(original: Any, processor: Any, i: int, req: Any, logits_output: Any,
                                *args: Any, **kwargs: Any) -> Any:
    """AROUND SchedulerBatchResultProcessor._maybe_collect_customized_info: SGLang appends entry i of every key
    to request i; a request that did not ask keeps none of the plugin's keys (an O(1) check per request in
    SGLang's own per-request loop)."""
    out = original(processor, i, req, logits_output, *args, **kwargs)
    info = getattr(req, "customized_info", None)
    if info and LOGP0_KEY in info and not asked(getattr(req.sampling_params, "custom_params", None)):
        for key in PLUGIN_KEYS:
            info.pop(key, None)
        if not info:
            req.customized_info = None
    return out


def meta_info_for_asking_requests(original: Any, manager: Any, meta_info: dict, state: Any, customized_info: dict,
                                  *args: Any, **kwargs: Any) -> Any:
    """AROUND TokenizerManager.update_request_meta_info: SGLang writes every key of an output batch into every
    request's meta_info (the output streamer pads the requests without it with None); a request that did not ask
    gets none of the plugin's keys."""
    if customized_info and LOGP0_KEY in customized_info:
        params = getattr(getattr(state, "obj", None), "sampling_params", None)
        if not asked(params.get("custom_params") if isinstance(params, dict) else None):
            customized_info = {k: v for k, v in customized_info.items() if k not in PLUGIN_KEYS}
    return original(manager, meta_info, state, customized_info, *args, **kwargs)


def announce_plugin(result: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """AFTER build_server_info: /server_info tells clients the plugin runs."""
    result["forerun_plugin"] = dict(PLUGIN_INFO)
    return result


# -- the fields ---------------------------------------------------------------------------------
def sampler_values(raw_logits: torch.Tensor, token_ids: torch.Tensor, pair_rows: torch.Tensor,
                   pair_temperatures: torch.Tensor) -> torch.Tensor:
    """log p0 and entropy of p0 of every asking row at its sampled token, and log q_τ' of every (row, τ') pair,
    as one 1-D tensor on the logits' device: [log p0 (k), entropy (k), log q_τ' (P)].

    raw_logits: (k, vocab) logits before temperature; token_ids: (k,) sampled ids; pair_rows: (P,) row of each
    pair among the k; pair_temperatures: (P,) its τ'."""
    z = raw_logits.float()
    tok = token_ids.long().view(-1, 1)
    logp0 = torch.log_softmax(z, dim=-1)
    p0 = logp0.exp()
    entropy = -torch.where(p0 > 0, p0 * logp0, torch.zeros_like(p0)).sum(dim=-1)
    parts = [logp0.gather(1, tok).view(-1), entropy]
    if pair_rows.numel():
        scaled = z.index_select(0, pair_rows) / pair_temperatures.view(-1, 1)
        parts.append(torch.log_softmax(scaled, dim=-1).gather(1, tok.index_select(0, pair_rows)).view(-1))
    return torch.cat(parts)


def attach(logits_output: Any, plan: AskingRows, host_values: torch.Tensor) -> None:
    """Put the step's values (`sampler_values`, on the CPU) in `customized_info`: one entry per batch row.  Rows
    that did not ask hold NaN, which no request receives (`collect_for_asking_requests`)."""
    n, k = len(plan), len(plan.rows)
    first = host_values[: 2 * k].view(2, k)
    if not plan.every_row:
        first = torch.full((2, n), float("nan")).index_copy_(1, plan.rows_cpu, first)
    logp0, entropy = first.tolist()
    table = torch.full((n, plan.width), float("nan"))
    table[plan.pair_cells] = host_values[2 * k:]
    by_temperature = table.tolist()
    for row, count in plan.short_rows:  # only rows asking for fewer τ' than another row of the batch
        by_temperature[row] = by_temperature[row][:count]
    info = dict(logits_output.customized_info or {})
    info.update({LOGP0_KEY: logp0, ENTROPY_KEY: entropy, LOGQ_BY_TEMPERATURE_KEY: by_temperature})
    logits_output.customized_info = info


def sampler_forward_hook(original: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND Sampler.forward(self, logits_output, sampling_info, ...)."""
    logits_output = args[1] if len(args) > 1 else kwargs["logits_output"]
    sampling_info = args[2] if len(args) > 2 else kwargs["sampling_info"]
    logits = logits_output.next_token_logits
    plan = getattr(sampling_info, "custom_params", None)
    if not isinstance(plan, AskingRows) or logits is None or logits.shape[0] != len(plan):
        return original(*args, **kwargs)
    on = plan.on(logits.device)
    # a copy: the sampler divides and softmaxes the logits in place
    raw = logits.clone() if plan.every_row else logits.index_select(0, on.rows)
    token_ids = original(*args, **kwargs)
    picked = token_ids if plan.every_row else token_ids.index_select(0, on.rows)
    values = sampler_values(raw, picked, on.pair_rows, on.pair_temperatures)
    attach(logits_output, plan, values.cpu())  # the step's one device-to-host copy
    return token_ids
