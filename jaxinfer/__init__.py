"""jaxinfer: an LLM inference server in pure JAX/XLA.

Offline use: ``from jaxinfer import LLM, SamplingParams``. The host-side modules
(scheduler, block manager, requests, buckets, batch) import no JAX; the model runner,
models, attention, sampler and kernels do.
"""
from jaxinfer.pooling_params import PoolingParams
from jaxinfer.sampling_params import SamplingParams

__all__ = ["LLM", "PoolingParams", "SamplingParams"]


def __getattr__(name):
    if name == "LLM":  # lazy: importing jaxinfer must not pull in JAX for host-side users
        from jaxinfer.entrypoints.llm import LLM

        return LLM
    raise AttributeError(name)
