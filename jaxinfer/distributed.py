"""Multi-host serving: ``jax.distributed`` start-up and the SPMD step protocol.

Design (the simplest correct one): in a multi-process run every process holds its
shards of the weights and KV cache and must launch the same compiled computations in
the same order (multi-controller SPMD). Process 0, the *leader*, owns the HTTP server,
the scheduler and the request state; every other process is a *follower* with the same
engine but no requests. Before each step the leader's runner sends that step's
`StepInputs` (bucket + padded numpy arrays, a few KB) to every follower over a TCP
stream (`StepChannel`), then runs the step itself; each follower receives it and runs
the identical step, so the collectives inside the step (gloo on CPU, NCCL on GPU)
match up. Sampled ids come out replicated, so the leader reads them locally; the
followers' copies are dropped. A "stop" message (or the leader's socket closing) ends
the followers' loop.

Start-up order on every process: `initialize` (before any other JAX call), build the
engine (the builder calls `attach`, which opens the channel: the leader listens on a
free port and announces it with ``multihost_utils.broadcast_one_to_all``; followers
connect to the coordinator's host), then the leader serves while followers call
`serve_follower`; the leader calls `shutdown` at exit. The wire format is a JSON
header plus raw array bytes (no pickle). See docs/distributed.md for launching by
hand, under SLURM and on Kubernetes.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import struct
import time

import numpy as np

from jaxinfer.config import ParallelConfig

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 300.0  # followers retry the leader for this long; the leader waits as long for them


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

    Returns:
      True when this is a multi-process run (``jax.process_count() > 1``).
    """
    import jax

    explicit = (parallel.coordinator_address, parallel.num_processes, parallel.process_id)
    if any(v is not None for v in explicit):
        jax.distributed.initialize(coordinator_address=parallel.coordinator_address,
                                   num_processes=parallel.num_processes, process_id=parallel.process_id)
    elif _cluster_env_present():
        jax.distributed.initialize()
    else:
        return False
    logger.info("jax.distributed: process %d of %d, %d local / %d global devices", jax.process_index(),
                jax.process_count(), jax.local_device_count(), jax.device_count())
    return jax.process_count() > 1


def is_leader() -> bool:
    """True on process 0 (and in single-process runs)."""
    import jax

    return jax.process_index() == 0


# ----- the step channel ------------------------------------------------------------------
def _send_msg(sock: socket.socket, header: dict, arrays: dict[str, np.ndarray] | None = None) -> None:
    arrays = arrays or {}
    header = dict(header, arrays=[[k, v.dtype.str, list(v.shape)] for k, v in arrays.items()])
    head = json.dumps(header).encode()
    body = b"".join(np.ascontiguousarray(v).tobytes() for v in arrays.values())
    sock.sendall(struct.pack("!II", len(head), len(body)) + head + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv_msg(sock: socket.socket) -> tuple[dict, dict[str, np.ndarray]] | None:
    sizes = _recv_exact(sock, 8)
    if sizes is None:
        return None
    n_head, n_body = struct.unpack("!II", sizes)
    head, body = _recv_exact(sock, n_head), _recv_exact(sock, n_body)
    if head is None or body is None:
        return None
    header = json.loads(head)
    arrays, off = {}, 0
    for name, dtype, shape in header.pop("arrays"):
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        arrays[name] = np.frombuffer(body, dt, count=int(np.prod(shape)), offset=off).reshape(shape)
        off += n
    return header, arrays


class StepChannel:
    """TCP fan-out from the leader to the followers (one stream each, in step order).

    Build it with `StepChannel.open` on every process at the same point of start-up.
    """

    def __init__(self, leader: bool, socks: list[socket.socket]):
        self.leader = leader
        self.socks = socks

    @classmethod
    def open(cls, coordinator_host: str, timeout: float = CONNECT_TIMEOUT_S) -> "StepChannel":
        """Leader: listen on a free port, announce it, accept every follower.
        Follower: learn the port, connect to ``coordinator_host`` (process 0's host).

        Raises:
          TimeoutError: a peer did not show up within ``timeout`` seconds.
        """
        import jax
        from jax.experimental import multihost_utils

        n_followers = jax.process_count() - 1
        if jax.process_index() == 0:
            server = socket.create_server(("", 0), family=socket.AF_INET6 if ":" in coordinator_host
                                          else socket.AF_INET, backlog=n_followers)
            server.settimeout(timeout)
            port = int(server.getsockname()[1])
            multihost_utils.broadcast_one_to_all(np.int32(port))
            socks = []
            try:
                for _ in range(n_followers):
                    conn, _ = server.accept()
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    socks.append(conn)
            except socket.timeout as e:
                raise TimeoutError(f"only {len(socks)} of {n_followers} followers connected") from e
            finally:
                server.close()
            return cls(True, socks)
        port = int(multihost_utils.broadcast_one_to_all(np.int32(0)))
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock = socket.create_connection((coordinator_host, port), timeout=10)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not reach the leader at {coordinator_host}:{port}") from None
                time.sleep(0.2)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(False, [sock])

    def send_step(self, inputs) -> None:
        """Leader: send one `StepInputs` to every follower."""
        b = inputs.bucket
        for s in self.socks:
            _send_msg(s, {"kind": "step", "bucket": [b.num_tokens, b.num_seqs, b.ctx_blocks]}, inputs.arrays)

    def send_stop(self) -> None:
        """Leader: tell every follower to leave its loop (errors from gone peers ignored)."""
        for s in self.socks:
            try:
                _send_msg(s, {"kind": "stop"})
            except OSError:
                pass

    def recv(self):
        """Follower: the next `StepInputs`, or None on "stop" or when the leader is gone."""
        from jaxinfer.batch import StepInputs
        from jaxinfer.buckets import Bucket

        msg = _recv_msg(self.socks[0])
        if msg is None or msg[0]["kind"] == "stop":
            return None
        return StepInputs(Bucket(*msg[0]["bucket"]), msg[1])

    def close(self) -> None:
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass


class LeaderRunner:
    """The leader's runner: broadcasts each step to the followers, then runs it.
    Everything else (``compile``, counters, ``params``) is the wrapped runner's."""

    def __init__(self, runner, channel: StepChannel):
        self.runner = runner
        self.channel = channel

    def execute(self, inputs):
        self.channel.send_step(inputs)
        return self.runner.execute(inputs)

    def __getattr__(self, name):
        return getattr(self.runner, name)


def _coordinator_host(coordinator_address: str | None) -> str:
    if coordinator_address is None:
        from jax._src import distributed as jax_distributed  # the address jax.distributed resolved

        coordinator_address = jax_distributed.global_state.coordinator_address
    if not coordinator_address:
        raise ValueError("no coordinator address: call jaxinfer.distributed.initialize first")
    return coordinator_address.rsplit(":", 1)[0].strip("[]")


def attach(engine, coordinator_address: str | None = None) -> None:
    """Join ``engine`` to the SPMD step protocol (all processes, same point of start-up).

    Leader: ``engine.runner`` becomes a `LeaderRunner`. Follower: the channel is kept
    as ``engine.step_channel`` for `serve_follower`.
    """
    channel = StepChannel.open(_coordinator_host(coordinator_address))
    engine.step_channel = channel
    if channel.leader:
        engine.runner = LeaderRunner(engine.runner, channel)
    logger.info("step channel open (%s)", "leader" if channel.leader else "follower")


def serve_follower(engine) -> int:
    """Follower loop: run every step the leader broadcasts, until it stops or goes away.

    Returns:
      Number of steps run.
    """
    channel: StepChannel = engine.step_channel
    runner = engine.runner
    n = 0
    while (inputs := channel.recv()) is not None:
        runner.execute(inputs)
        n += 1
    channel.close()
    logger.info("follower: leader stopped after %d steps", n)
    return n


def shutdown(engine=None) -> None:
    """Leader: send "stop" to the followers and close the channel; every process then
    leaves ``jax.distributed`` (call on all processes at exit)."""
    import jax

    channel = getattr(engine, "step_channel", None) if engine is not None else None
    if channel is not None and channel.leader:
        channel.send_stop()
        channel.close()
    if jax.process_count() > 1:
        jax.distributed.shutdown()
