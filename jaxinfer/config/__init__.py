"""The configuration tree, as frozen data that flows down from the front doors.

`engine_config`: the cache, scheduler, parallel and engine configs and their limits;
`model_config`: `ModelConfig`, the model's hyperparameters; `args`: the one flag table
(`EngineArgs`) that ``server.py``, `LLM`, the planner and the cluster launcher read. The
configs are re-exported here (``from jaxinfer.config import EngineConfig, ModelConfig``).
Importing this package imports no JAX.
"""
from jaxinfer.config.engine_config import (ATTENTION_BACKENDS, BLOCK_SIZE, BLOCK_SIZES, DEFAULT_GPU_MEMORY_UTILIZATION,
                                           DEFAULT_MAX_NUM_SEQS, DEFAULT_STATIC_BATCH, DTYPES, KV_CACHE_DTYPES,
                                           QUANTIZATIONS, CacheConfig, EngineConfig, ParallelConfig, SchedulerConfig)
from jaxinfer.config.model_config import ModelConfig

__all__ = ["ATTENTION_BACKENDS", "BLOCK_SIZE", "BLOCK_SIZES", "DEFAULT_GPU_MEMORY_UTILIZATION", "DEFAULT_MAX_NUM_SEQS",
           "DEFAULT_STATIC_BATCH", "DTYPES", "KV_CACHE_DTYPES", "QUANTIZATIONS", "CacheConfig", "EngineConfig",
           "ModelConfig", "ParallelConfig", "SchedulerConfig"]
