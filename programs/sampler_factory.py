"""The one constructor of a power sampler: sequential, round-based PreSTO, or streaming PreSTO.

It sits above both sampler modules (`samplers`: the blockwise loop, sequential and round-based PreSTO;
`streaming_presto`: streaming PreSTO, which builds on `samplers.BlockwiseSampler`).
"""

from __future__ import annotations

from .samplers import BlockwiseSampler, PrestoSampler, SequentialSampler
from .sampler_config import PrefetchConfig, SamplerConfig
from .streaming_presto import StreamingPrestoSampler
from .suffixes import ProposalModel


def make_sampler(model: ProposalModel, config: SamplerConfig, *, presto: bool = False,
                 prefetch: PrefetchConfig = PrefetchConfig()) -> BlockwiseSampler:
    """The sequential sampler of `config.kind`, or its PreSTO variant (streaming when `prefetch.streaming`)."""
    if presto and prefetch.streaming:
        return StreamingPrestoSampler(model, config, prefetch)
    return PrestoSampler(model, config, prefetch) if presto else SequentialSampler(model, config)
