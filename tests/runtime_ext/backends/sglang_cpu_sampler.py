"""Run forerun's plugin inside SGLang 0.5.23's real `Sampler.forward` on CPU tensors, or on a GPU's (a
subprocess of test_sglang_plugin.py; argv: runtime folder, spec JSON, device (default cpu); prints one JSON object).

Importing `sglang.srt.layers.sampler` on a CPU machine needs, besides the frontend install, these packages
(`FORERUN_SGLANG_CPU_RUNTIME=1 scripts/setup` puts them, --no-deps, in .forerun-cache/sglang-cpu-runtime,
outside the venv so that the frontend keeps its no-triton path): orjson, triton==3.9.0, starlette, pyzmq,
apache-tvm-ffi, dill, anyio, sniffio, sentencepiece, compressed-tensors, loguru, openai, partial-json-parser;
and two import-time stubs, installed only while the sampler module imports (after transformers, whose
torchvision probe a stub would break): `sglang.srt.multimodal.internvl_utils` (two constants; the real module
imports torchvision) and `torchvision.transforms` (`InterpolationMode`, `functional`, imported at module level by
srt/configs/deepseek_ocr.py).  The plugin is loaded the way a server loads it: `load_plugins()` finds forerun's
`sglang.srt.plugins` entry point and applies its hooks with SGLang's HookRegistry (the one on
`TokenizerManager.update_request_meta_info` is not applied here: that module needs fastapi; test_sglang_plugin.py
runs that method from SGLang's source instead).
"""

from __future__ import annotations

import enum
import json
import os
import sys
import types

sys.path.insert(0, sys.argv[1])
os.environ["FORERUN_SGLANG_PLUGIN"] = "1"

import sglang  # noqa: E402,F401  (real init: triton is importable here)
import torch  # noqa: E402
import transformers  # noqa: E402,F401


def _import_sampler():
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:  # e.g. a GPU machine: the real modules import (a stub
        # there breaks transformers' find_spec probe of torchvision)
        import sglang.srt.layers.sampler as sampler_module

        return sampler_module
    internvl = types.ModuleType("sglang.srt.multimodal.internvl_utils")
    internvl.IMAGENET_MEAN, internvl.IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    tv, tvt, tvf = (types.ModuleType(n) for n in ("torchvision", "torchvision.transforms",
                                                 "torchvision.transforms.functional"))
    tvt.InterpolationMode = enum.Enum("InterpolationMode", "NEAREST BILINEAR BICUBIC")
    tvt.functional, tv.transforms = tvf, tvt
    stubs = {m.__name__: m for m in (tv, tvt, tvf)}
    sys.modules[internvl.__name__] = internvl
    sys.modules.update(stubs)
    try:
        import sglang.srt.layers.sampler as sampler_module
    finally:
        for name in stubs:
            sys.modules.pop(name, None)
    return sampler_module


def main() -> None:
    sampler_module = _import_sampler()
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.plugins import load_plugins
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    load_plugins()
    sampler = sampler_module.Sampler.__new__(sampler_module.Sampler)
    torch.nn.Module.__init__(sampler)
    sampler.__dict__.update(tp_sync_group=None, cp_sync_group=None, rl_on_policy_target=None,
                            enable_deterministic=False, use_log_softmax_logprob=False, use_ascend_backend=False,
                            sampling_mask_max_tokens=0, output_logprob_processor=None)
    spec = json.loads(sys.argv[2])
    device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    logits = torch.tensor(spec["logits"], dtype=torch.float32, device=device)
    n = logits.shape[0]
    temps = torch.tensor(spec["temperatures"], dtype=torch.float32, device=device).view(-1, 1)
    info = SamplingBatchInfo(
        temperatures=temps, top_ps=torch.ones(n, device=device),
        top_ks=torch.full((n,), 1 << 30, dtype=torch.int32, device=device), min_ps=torch.zeros(n, device=device),
        is_all_greedy=False, is_any_greedy=False, need_top_p_sampling=False, need_top_k_sampling=False,
        need_min_p_sampling=False, vocab_size=logits.shape[1],
        sampling_seed=None, device=device)  # the seeded path's murmur hash needs sgl_kernel (CUDA): multinomial
    reqs = [types.SimpleNamespace(sampling_params=types.SimpleNamespace(custom_params=p)) for p in spec["custom"]]
    info.adjusted_from_schedule_batch(types.SimpleNamespace(reqs=reqs), logits.shape[1])  # the plugin's AFTER hook
    out = LogitsProcessorOutput(next_token_logits=logits.clone())
    ids = sampler.forward(out, info, False, [0] * n, [None] * n, torch.tensor(spec["positions"], device=device))
    collected = _collected(reqs, out)
    batch_ops = _batch_ops(SamplingBatchInfo, info, logits.shape[1])
    print(json.dumps({"token_ids": ids.tolist(), "customized_info": out.customized_info, **batch_ops,
                      "collected": collected,
                      "scaled_in_place": not torch.equal(out.next_token_logits, logits),
                      "token_device": str(ids.device),
                      "hooked": getattr(sampler_module.Sampler.forward, "__wrapped__", None) is not None,
                      "server_info_announces": "forerun_plugin" in _server_info()}))


def _collected(reqs, logits_output) -> dict:
    """SGLang's own per-request collection of customized_info (hooked by the plugin): the keys each request keeps."""
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

    for i, req in enumerate(reqs):
        req.customized_info = None
        SchedulerBatchResultProcessor._maybe_collect_customized_info(types.SimpleNamespace(), i, req, logits_output)
    return {str(i): sorted(r.customized_info) if r.customized_info else None for i, r in enumerate(reqs)}


def _batch_ops(cls, info, vocab: int) -> dict:
    """SGLang's own copy_for_forward / filter_batch / merge_batch keep each row's custom_params (hooks)."""
    penalties = types.SimpleNamespace(is_required=False, filter=lambda *_: None, merge=lambda *_: None)
    info.penalizer_orchestrator = penalties
    copied = info.copy_for_forward().custom_params
    info.filter_batch([0, 2], torch.tensor([0, 2], device=info.device))
    filtered = list(info.custom_params)
    d = info.device
    other = cls(temperatures=torch.ones(1, 1, device=d), top_ps=torch.ones(1, device=d),
                top_ks=torch.ones(1, dtype=torch.int32, device=d), min_ps=torch.zeros(1, device=d), is_all_greedy=True,
                is_any_greedy=True, need_top_p_sampling=False, need_top_k_sampling=False, need_min_p_sampling=False,
                vocab_size=vocab, penalizer_orchestrator=penalties, device=d)
    info.merge_batch(other)
    return {"custom_params_after_copy": copied, "custom_params_after_filter": filtered,
            "custom_params_after_merge": info.custom_params}


def _server_info() -> dict:
    """build_server_info as http_server calls it (the hooked function, looked up after load_plugins)."""
    import sglang.srt.utils.common as common

    common.describe_kv_events_publisher = lambda _args: None
    return common.build_server_info(types.SimpleNamespace(resolved_dict=lambda: {}, launch_command=""), {})


if __name__ == "__main__":
    main()
