"""Multi-host serving: ``jax.distributed`` start-up, the SPMD step protocol, and its failures.

Design (the simplest correct one): in a multi-process run every process holds its
shards of the weights and KV cache and must launch the same compiled computations in
the same order (multi-controller SPMD). Process 0, the *leader*, owns the HTTP server,
the scheduler and the request state; every other process is a *follower* with the same
engine but no requests. Before each step the leader's runner sends that step's
`StepInputs` (bucket + padded numpy arrays, a few KB) to every follower over a TCP
stream (`jaxinfer.distributed.step_channel.StepChannel`), then runs the step itself; each follower
receives it and runs the identical step, so the collectives inside the step (gloo on
CPU, NCCL on GPU) match up. Sampled ids come out replicated, so the leader reads them
locally; the followers' copies are dropped. A "stop" message ends the followers' loop.

Start-up order on every process: `initialize` (before any other JAX call: starts
``jax.distributed``, opens the step channel and its liveness watch, installs the exit
guard of `jaxinfer.distributed.peer_failure`), build the engine (the KV pool's block count is
agreed over the processes, `agree_num_blocks`; the builder wraps the runner with
`step_runner` before it builds the engine, so the leader's runner broadcasts its steps), then the leader serves while followers call
`serve_follower`; every process calls `shutdown` at an orderly exit.

Failures (`jaxinfer.distributed.peer_failure`): a process that fails (an exception at start-up or
later, a killed process, a vanished host, a step that outlives `STEP_DEADLINE_S`)
ends every process of the job with a logged reason and exit status 1, within about a
second when a process dies (its streams close) and `HEARTBEAT_TIMEOUT_S` when a host
goes silent; nothing waits in a collective or in ``jax.distributed``'s shutdown barrier.
See docs/distributed.md for launching by hand, under SLURM and on Kubernetes.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time

from jaxinfer.distributed import peer_failure
from jaxinfer.config import ParallelConfig
from jaxinfer.distributed.step_channel import StepChannel

logger = logging.getLogger(__name__)

STEP_DEADLINE_S = 600.0  # one step (a compile included) longer than this: a peer is stuck in a collective
SHUTDOWN_BOUND_S = 15.0  # the orderly jax.distributed shutdown may take this long, then the process just exits
AGREE_TIMEOUT_S = 3600.0  # waiting for the slowest process to plan its KV pool (a dead one is the watch's news)

_channel: StepChannel | None = None
_agreements = itertools.count()


def _cluster_env_present() -> bool:
    """True when the environment describes a multi-process job jax.distributed can read."""
    env = os.environ
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return True
    if "SLURM_JOB_ID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        return True
    if "OMPI_MCA_orte_hnp_uri" in env:
        return True
    return "KUBERNETES_SERVICE_HOST" in env and "JOB_COMPLETION_INDEX" in env  # indexed Job / JobSet


def initialize(parallel: ParallelConfig) -> bool:
    """Start ``jax.distributed`` when a multi-process run is asked for. Call it first,
    before anything else touches JAX.

    Explicit ``coordinator_address`` / ``num_processes`` / ``process_id`` are passed to
    ``jax.distributed.initialize`` (which fills the unset ones from the cluster);
    otherwise a cluster environment that JAX auto-detects (``JAX_COORDINATOR_ADDRESS``,
    SLURM with more than one task, Open MPI, a Kubernetes indexed Job with the
    ``kubernetes`` package) starts it with no arguments. Otherwise nothing happens.

    In a multi-process run it then opens the step channel (`StepChannel`, with its
    heartbeats) and installs `jaxinfer.distributed.peer_failure`'s exit guard: from here on a failure
    of any process ends every process. If ``jax.distributed`` itself cannot start (a peer
    that never joins within its ``initialization_timeout``, 300 s) the process exits with
    status 1.

    Returns:
      True when this is a multi-process run (``jax.process_count() > 1``).
    """
    import jax
    from jax._src import distributed as jax_distributed  # the client and address jax.distributed holds

    explicit = (parallel.coordinator_address, parallel.num_processes, parallel.process_id)
    if any(v is not None for v in explicit):
        kwargs = dict(coordinator_address=parallel.coordinator_address, num_processes=parallel.num_processes,
                      process_id=parallel.process_id)
    elif _cluster_env_present():
        kwargs = {}
    else:
        return False
    try:
        jax.distributed.initialize(**kwargs)
    except Exception as e:  # e.g. a peer never joined within initialization_timeout (300 s)
        peer_failure.fail(f"jax.distributed could not start: {type(e).__name__}: {e}")
    logger.info("jax.distributed: process %d of %d, %d local / %d global devices", jax.process_index(),
                jax.process_count(), jax.local_device_count(), jax.device_count())
    if jax.process_count() == 1:
        return False
    global _channel
    peer_failure.install_exit_guard()  # from here on, any exit of any process ends them all
    state = jax_distributed.global_state
    _channel = StepChannel.open(state.client, jax.process_index(), jax.process_count(),
                                _coordinator_host(state.coordinator_address))
    logger.info("step channel open (%s)", "leader" if _channel.leader else "follower")
    return True


def is_leader() -> bool:
    """True on process 0 (and in single-process runs)."""
    import jax

    return jax.process_index() == 0


def agree_num_blocks(num_blocks: int) -> int:
    """The KV pool size every process uses: the smallest ``num_blocks`` any process planned.

    Each process plans its pool from its own addressable devices; the compiled steps need
    one cache shape everywhere, so each publishes its count in ``jax.distributed``'s
    key-value store and takes the minimum (a single process: ``num_blocks`` itself).
    Call it on every process at the same point of start-up.

    Args:
      num_blocks: this process's planned block count (null block included).
    Returns:
      The agreed block count (<= ``num_blocks``).
    """
    import jax
    from jax._src import distributed as jax_distributed

    if jax.process_count() == 1:
        return num_blocks
    client = jax_distributed.global_state.client
    key = f"jaxinfer/num_blocks/{next(_agreements)}"
    client.key_value_set(f"{key}/{jax.process_index()}", str(int(num_blocks)))
    counts = [int(client.blocking_key_value_get(f"{key}/{p}", int(AGREE_TIMEOUT_S * 1000)))
              for p in range(jax.process_count())]
    agreed = min(counts)
    if agreed != num_blocks:
        logger.info("KV pool: %d blocks planned here, %d agreed (the smallest over processes %s)", num_blocks,
                    agreed, counts)
    return agreed


class StepDeadline:
    """A watchdog around the blocking collectives of a step: if one ``with`` block lasts
    longer than ``seconds``, `jaxinfer.distributed.peer_failure.fail` ends the process (a peer that
    is alive but never joins the collective would otherwise hold it forever). One
    monitor thread, started on first use; entering and leaving cost two assignments."""

    def __init__(self, seconds: float = STEP_DEADLINE_S, what: str = "a step"):
        self.seconds = seconds
        self.what = what
        self._until: float | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "StepDeadline":
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="step-deadline", daemon=True)
            self._thread.start()
        self._until = time.monotonic() + self.seconds
        return self

    def __exit__(self, *exc) -> None:
        self._until = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.seconds / 4))
            until = self._until
            if until is not None and time.monotonic() > until:
                peer_failure.fail(f"{self.what} has not finished within {self.seconds:g} s: a process is stuck "
                                  "in a collective")


class LeaderRunner:
    """The leader's runner: broadcasts each step to the followers, then runs it (under a
    `StepDeadline`). Everything else (``compile``, counters, ``params``) is the wrapped
    runner's."""

    def __init__(self, runner, channel: StepChannel):
        self.runner = runner
        self.channel = channel
        self.deadline = StepDeadline()

    def execute(self, inputs):
        with self.deadline:
            self.channel.send_step(inputs)
            return self.runner.execute(inputs)

    def __getattr__(self, name):
        return getattr(self.runner, name)


def _coordinator_host(coordinator_address: str | None) -> str:
    if not coordinator_address:
        raise ValueError("no coordinator address: call jaxinfer.distributed.multihost.initialize first")
    return coordinator_address.rsplit(":", 1)[0].strip("[]")


def step_runner(runner):
    """The runner of this process's engine in the SPMD step protocol (every process, before
    its engine is built): on the leader a `LeaderRunner` around ``runner``, on a follower
    ``runner`` itself (`serve_follower` runs the leader's steps on it).

    Raises:
      RuntimeError: `initialize` did not open a channel (not a multi-process run).
    """
    if _channel is None:
        raise RuntimeError("no step channel: call jaxinfer.distributed.multihost.initialize first")
    return LeaderRunner(runner, _channel) if _channel.leader else runner


def serve_follower(engine) -> int:
    """Follower loop: run every step the leader broadcasts (on ``engine.runner``), until it
    sends "stop". (The leader's failure ends this process from the channel's reader thread.)

    Returns:
      Number of steps run.
    Raises:
      RuntimeError: `initialize` did not open a channel (not a multi-process run).
    """
    if _channel is None:
        raise RuntimeError("no step channel: call jaxinfer.distributed.multihost.initialize first")
    channel: StepChannel = _channel
    runner = engine.runner
    deadline = StepDeadline()
    n = 0
    while (inputs := channel.recv()) is not None:
        with deadline:
            runner.execute(inputs)
        n += 1
    logger.info("follower: leader stopped after %d steps", n)
    return n


def shutdown(engine=None, error: str | None = None) -> None:
    """End a multi-process run (call on every process at exit; a no-op on one process).

    Orderly (``error`` None): the leader sends "stop" to the followers, then every process
    leaves ``jax.distributed`` (bounded by `SHUTDOWN_BOUND_S`: past it the process exits
    with status 0 anyway). With ``error`` (e.g. the leader's engine failed): the peers
    are told and the process exits with status 1 (`jaxinfer.distributed.peer_failure.fail`; never returns).

    Args:
      engine: unused (kept for callers that pass their engine); the channel is the module's.
      error: why this process fails, or None for an orderly end.
    """
    import jax

    del engine
    if _channel is None:
        return
    if error is not None:
        peer_failure.fail(error)
    if _channel.leader:
        _channel.send_stop()
    _channel.stopping = True
    peer_failure.mark_clean_exit()
    timer = threading.Timer(SHUTDOWN_BOUND_S, _shutdown_overran)
    timer.daemon = True
    timer.start()
    if jax.process_count() > 1:
        jax.distributed.shutdown()
    timer.cancel()
    _channel.close()


def _shutdown_overran() -> None:
    logger.warning("jax.distributed shutdown took longer than %g s (a peer is gone): exiting now", SHUTDOWN_BOUND_S)
    peer_failure.hard_exit(0)
