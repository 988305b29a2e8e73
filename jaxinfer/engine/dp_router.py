"""Data-parallel replicas and the router in front of them; building sharded engines.

Owns `build_parallel_engine` (the mesh path of `jaxinfer.engine.builder.build_engine`): one
``(data, model)`` mesh (`jaxinfer.distributed.sharding.make_mesh`), parameters placed once on it
(sharded over ``model``, replicated over ``data``: restored from orbax straight into
their shards, or created sharded for ``--load-format dummy``), then per row of the mesh
one `LLMEngine` (own scheduler, block manager, KV pool and compiled steps) on that
row's devices, built by `jaxinfer.engine.builder.build_replica` (the builder of a one-device
engine too), viewing the same parameter buffers (`sharding.split_replicas`, no copy).

With ``data_parallel_size == 1`` the single engine is returned as is (tensor
parallelism only). With more, a `DataParallelRouter` stands in for the engine: it
implements the engine protocol (`jaxinfer.engine.protocol.Engine`: ``add_requests``,
``step``, ``abort_request``, ``snapshot`` merged over the replicas, ...), sends
each new request to the least-loaded replica and steps the busy replicas concurrently
(one thread each: a replica's step blocks on its device read-back, and the devices of
different replicas work at the same time).
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import jax

from jaxinfer.distributed import sharding
from jaxinfer.config import EngineConfig, ModelConfig
from jaxinfer.engine.llm_engine import LLMEngine
from jaxinfer.engine.protocol import EngineDescription, RequestSpec, SharedGrammar
from jaxinfer.engine.snapshot import EngineSnapshot
from jaxinfer.errors import RequestError
from jaxinfer.outputs import RequestOutput
from jaxinfer.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def build_parallel_engine(config: EngineConfig, model_config: ModelConfig, params, tokenizer=None, *,
                          abstract: bool = False, plan=None, device_memory: int | None = None):
    """Build the engine(s) for ``config.parallel`` on a ``(data, model)`` mesh.

    Args:
      config: engine configuration; ``config.parallel`` gives TP and DP sizes.
      model_config: model hyperparameters.
      params: None (random init created directly in its shards), a tree of numpy arrays
        (each device receives only its slice), or ``jax.Array``s already placed with
        `sharding.param_shardings` on the same mesh (orbax restore; kept, no copy).
      tokenizer: optional tokenizer shared by the replicas.
      abstract: build with abstract weights and KV (``jax.ShapeDtypeStruct`` in their shardings;
        ``params`` must be None): nothing is allocated and the runners only lower their steps
        (`jaxinfer.engine.step_check`).
      plan, device_memory: as `jaxinfer.engine.builder.build_replica`'s.
    Returns:
      An `LLMEngine` (DP 1) or a `DataParallelRouter` (DP > 1). In a multi-process run
      the engine's runner also takes part in the SPMD step protocol of
      `jaxinfer.distributed.multihost` (`jaxinfer.engine.builder.build_replica` wraps it).
    Raises:
      ValueError: not enough devices; multi-process with DP > 1 or with a mesh that
        does not cover every device.
    """
    par = config.parallel
    tp, dp = par.tensor_parallel_size, par.data_parallel_size
    if jax.process_count() > 1:
        if dp != 1 or tp != jax.device_count():
            raise ValueError(f"multi-process serving needs data_parallel_size 1 and tensor_parallel_size = all "
                             f"{jax.device_count()} devices (got TP {tp}, DP {dp}); run one server per replica "
                             "behind a load balancer for data parallelism across hosts")
    ep = par.expert_parallel_degree
    mesh = sharding.make_mesh(tp, dp, expert_parallel_size=ep)
    shardings = sharding.param_shardings(model_config, mesh)
    if abstract:
        if params is not None:
            raise ValueError("an abstract engine takes no params (their shapes come from the config)")
        params = sharding.abstract_params_sharded(model_config, config.dtype, shardings)
    elif params is None:
        params = sharding.init_params_sharded(model_config, config.dtype, config.seed, shardings)
    else:
        params = sharding.place_params(params, shardings)
    fallback = sharding.replicated_axes(model_config, tp, ep)
    if fallback:
        logger.warning("TP %d does not divide %s: those axes are replicated on every device of a replica "
                       "(see jaxinfer.distributed.sharding)", tp, ", ".join(fallback))
    replica_params = sharding.split_replicas(params, mesh) if dp > 1 else [params]
    from jaxinfer.engine.builder import build_replica

    # one grammar engine for all replicas (one tokenizer): a constraint compiled in the API's
    # thread through the router is in every replica's cache
    grammar = SharedGrammar(tokenizer, model_config.vocab_size, frozenset(model_config.eos_token_ids))
    engines = [build_replica(config, model_config, p, tokenizer, sub, grammar=grammar, plan=plan,
                             device_memory=device_memory)
               for p, sub in zip(replica_params, sharding.replica_meshes(mesh))]
    return engines[0] if dp == 1 else DataParallelRouter(engines)


def least_loaded(engines: list[LLMEngine], pending: list[int] | None = None) -> int:
    """Index of the replica to take a new request: fewest running + waiting requests
    (plus ``pending[i]`` about to be added to replica i), then most free KV blocks, then
    lowest index."""
    pending = pending or [0] * len(engines)
    return min(range(len(engines)), key=lambda i: (engines[i].num_running + engines[i].num_waiting + pending[i],
                                                   -engines[i].num_free_blocks, i))


class DataParallelRouter:
    """Several `LLMEngine` replicas behind the engine protocol (`jaxinfer.engine.protocol.Engine`).

    Request ids are unique across replicas; each request lives on one replica for its
    whole life (its KV blocks are there). Not thread-safe, like `LLMEngine`: one thread
    calls it (the router's own worker threads only run replica steps).

    Args:
      engines: replicas with the same config and model (from `build_parallel_engine`).
    """

    def __init__(self, engines: list[LLMEngine]):
        if not engines:
            raise ValueError("DataParallelRouter needs at least one engine")
        self.engines = engines
        self.config = engines[0].config
        self.model_config = engines[0].model_config
        self.tokenizer = engines[0].tokenizer
        first = engines[0].describe()
        self._description = EngineDescription(first.num_blocks, f"{len(engines)} replicas x {first.kv_cache}",
                                              len(engines), first.plan)
        self.kv_cache_description = self._description.kv_cache
        self._owner: dict[str, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=len(engines), thread_name_prefix="dp-replica")

    # ----- requests -----------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, **kwargs) -> None:
        """Queue one request: `add_requests` with a group of one (keywords as `RequestSpec`)."""
        self.add_requests([RequestSpec(request_id, prompt_token_ids, params, **kwargs)])

    def add_requests(self, specs: Sequence[RequestSpec]) -> None:
        """Admit a group all or none, each request on the least-loaded replica at its turn
        (`least_loaded`, counting the group's earlier members). Every replica checks its
        share (`LLMEngine.check_requests`) before any is queued; errors as
        `LLMEngine.add_requests`."""
        ids = [s.request_id for s in specs]
        for rid in ids:
            if rid in self._owner or ids.count(rid) > 1:
                raise RequestError(f"duplicate request id {rid!r}", param="request_id")
        shares: dict[int, list[RequestSpec]] = {}
        added = [0] * len(self.engines)
        for spec in specs:
            i = least_loaded(self.engines, added)
            shares.setdefault(i, []).append(spec)
            added[i] += 1
        for i, share in shares.items():
            self.engines[i].check_requests(share)
        for i, share in shares.items():
            self.engines[i].add_requests(share)
            self._owner.update((s.request_id, i) for s in share)

    def abort_request(self, request_id: str) -> None:
        """Abort on the owning replica; unknown ids are ignored."""
        i = self._owner.get(request_id)
        if i is not None:
            self.engines[i].abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return any(e.has_unfinished_requests() for e in self.engines)

    # ----- the step -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step of every replica that has work, run concurrently; outputs concatenated
        in replica order."""
        busy = [e for e in self.engines if e.has_unfinished_requests()]
        if len(busy) == 1:
            results = [busy[0].step()]
        else:
            results = list(self._pool.map(lambda e: e.step(), busy))
        outputs = [o for r in results for o in r]
        for o in outputs:
            if o.finished:
                self._owner.pop(o.request_id, None)
        return outputs

    def warmup(self) -> float:
        return sum(e.warmup() for e in self.engines)

    def grammar_engine(self):
        """The replicas' grammar engine: one for all of them (`build_parallel_engine` gives
        them one `SharedGrammar`), so a constraint compiled through it before `add_requests`
        is in the cache of whichever replica takes the request.

        Raises:
          RequestError: no tokenizer (structured outputs need one).
        """
        return self.engines[0].grammar_engine()

    def describe(self) -> EngineDescription:
        """One replica's pool, ``"N replicas x "`` its sizing line, and N."""
        return self._description

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

    # ----- introspection (sums over replicas) ---------------------------------------------
    @property
    def requests(self) -> dict:
        return {k: v for e in self.engines for k, v in e.requests.items()}

    @property
    def num_free_blocks(self) -> int:
        return sum(e.num_free_blocks for e in self.engines)

    @property
    def num_total_blocks(self) -> int:
        return sum(e.num_total_blocks for e in self.engines)

    @property
    def num_running(self) -> int:
        return sum(e.num_running for e in self.engines)

    @property
    def num_waiting(self) -> int:
        return sum(e.num_waiting for e in self.engines)

    def snapshot(self) -> EngineSnapshot:
        """Every replica's `LLMEngine.snapshot`, merged (counts summed, ratios pooled)."""
        return EngineSnapshot.merge(e.snapshot() for e in self.engines)

    @property
    def num_steps(self) -> int:
        """Steps summed over replicas (grows whenever any replica executed a batch)."""
        return sum(e.num_steps for e in self.engines)

    def wake_time(self) -> float | None:
        """The earliest of the replicas' `LLMEngine.wake_time`."""
        return min((t for e in self.engines if (t := e.wake_time()) is not None), default=None)
