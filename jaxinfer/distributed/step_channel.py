"""The leader -> follower step stream of a multi-process run, and the liveness watch on it.

One TCP stream between the leader (process 0) and each follower, opened right after
``jax.distributed`` starts (before any model is built), so that a failure at any point,
start-up included, reaches every process. Messages are a JSON header plus raw array
bytes (no pickle):

* leader -> follower: ``step`` (a `jaxinfer.runner.batch.StepInputs`), ``stop`` (orderly end),
  ``error`` (the leader fails: its reason), ``ping`` (heartbeat);
* follower -> leader: ``hello`` (its process id, once), ``ping``, ``error``.

A process that announced its own failure (``error`` sent) only logs the peers' ``error``
answers (they end because of it) and goes on with its own exit.

Every process runs one heartbeat thread (a ``ping`` to each peer every
`HEARTBEAT_INTERVAL_S`) and one reader thread per peer. A reader that sees the stream
close (the peer exited or was killed: the kernel closes its sockets, so even SIGKILL is
seen at once), an ``error`` message, or nothing at all for `HEARTBEAT_TIMEOUT_S` (a host
that vanished, a hung process) calls `jaxinfer.distributed.peer_failure.fail`, which ends this
process too, wherever its main thread is blocked (a collective included). The port is
announced through ``jax.distributed``'s key-value store, which has its own timeout.
"""
from __future__ import annotations

import json
import logging
import queue
import socket
import struct
import threading
import time

import numpy as np

from jaxinfer.distributed import peer_failure

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 300.0  # followers wait this long for the leader's port; the leader as long for them
HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_TIMEOUT_S = 15.0  # a peer silent this long is taken for dead
PORT_KEY = "jaxinfer/step_channel_port"


# ----- wire format -----------------------------------------------------------------------
def send_msg(sock: socket.socket, header: dict, arrays: dict[str, np.ndarray] | None = None) -> None:
    """Write one message: ``!II`` (header length, body length), the JSON header, the arrays' bytes."""
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


def recv_msg(sock: socket.socket) -> tuple[dict, dict[str, np.ndarray]] | None:
    """Read one message as (header, arrays), or None when the stream closed.

    Raises:
      socket.timeout: nothing arrived within the socket's timeout.
    """
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
        count = int(np.prod(shape))
        arrays[name] = np.frombuffer(body, dt, count=count, offset=off).reshape(shape)
        off += count * dt.itemsize
    return header, arrays


# ----- the channel -----------------------------------------------------------------------
class StepChannel:
    """The leader's streams to its followers (or a follower's stream to the leader), with
    heartbeats and a reader thread per peer (module docstring).

    Build it with `StepChannel.open` on every process right after ``jax.distributed``
    starts. Attributes: ``leader`` (bool), ``peers`` (process id -> socket).
    """

    def __init__(self, leader: bool, peers: dict[int, socket.socket]):
        self.leader = leader
        self.peers = peers
        self.stopping = False  # an orderly end is under way: streams closing is expected
        self.announced_failure = False  # this process told its peers it fails: their "error" echoes are expected
        self._steps: queue.SimpleQueue = queue.SimpleQueue()  # follower: StepInputs, None on stop
        self._send_lock = threading.Lock()

    @classmethod
    def open(cls, client, process_id: int, process_count: int, leader_host: str,
             timeout: float = CONNECT_TIMEOUT_S) -> "StepChannel":
        """Connect every follower to the leader and start the watch threads.

        Args:
          client: ``jax.distributed``'s runtime client (its key-value store carries the port).
          process_id, process_count: this process and the job's size.
          leader_host: the host followers connect to (the coordinator's host).
        Raises:
          TimeoutError: a peer did not show up within ``timeout`` seconds.
        """
        if process_id == 0:
            channel = cls(True, _accept_followers(client, process_count - 1, leader_host, timeout))
        else:
            port = int(client.blocking_key_value_get(PORT_KEY, int(timeout * 1000)))
            sock = _connect(leader_host, port, timeout)
            send_msg(sock, {"kind": "hello", "process": process_id})
            channel = cls(False, {0: sock})
        channel._start_watch()
        return channel

    # ----- sending -------------------------------------------------------------------------
    def _send_all(self, header: dict, arrays: dict | None = None, ignore_errors: bool = False) -> None:
        with self._send_lock:
            for sock in self.peers.values():
                try:
                    send_msg(sock, header, arrays)
                except OSError:
                    if not ignore_errors:
                        raise

    def send_step(self, inputs) -> None:
        """Leader: send one `jaxinfer.runner.batch.StepInputs` to every follower.

        Raises:
          OSError: a follower's stream is gone (its reader thread is ending the process).
        """
        b = inputs.bucket
        self._send_all({"kind": "step", "bucket": [b.num_tokens, b.num_seqs, b.ctx_blocks]}, inputs.to_arrays())

    def send_stop(self) -> None:
        """Leader: tell every follower to leave its loop (errors from gone peers ignored)."""
        self.stopping = True
        self._send_all({"kind": "stop"}, ignore_errors=True)

    def send_error(self, reason: str) -> None:
        """Tell the peers that this process fails, and why (best effort, never blocks long).
        From then on an ``error`` from a peer (its own exit, caused by this news) is only
        logged: this process is ending on its own terms."""
        self.stopping = True
        self.announced_failure = True
        for sock in self.peers.values():
            try:
                sock.settimeout(1.0)
            except OSError:
                pass
        self._send_all({"kind": "error", "reason": reason}, ignore_errors=True)

    def recv(self):
        """Follower: the next `StepInputs`, or None after "stop"."""
        return self._steps.get()

    def close(self) -> None:
        self.stopping = True
        for s in self.peers.values():
            try:
                s.close()
            except OSError:
                pass

    # ----- watching ------------------------------------------------------------------------
    def _start_watch(self) -> None:
        for sock in self.peers.values():
            sock.settimeout(HEARTBEAT_TIMEOUT_S)
        peer_failure.set_peer_notifier(self.send_error)
        for pid, sock in self.peers.items():
            threading.Thread(target=self._read, args=(pid, sock), name=f"step-channel-read-{pid}", daemon=True).start()
        threading.Thread(target=self._heartbeat, name="step-channel-heartbeat", daemon=True).start()

    def _heartbeat(self) -> None:
        while not self.stopping:
            self._send_all({"kind": "ping"}, ignore_errors=True)  # a gone peer is its reader's news
            time.sleep(HEARTBEAT_INTERVAL_S)

    def _read(self, pid: int, sock: socket.socket) -> None:
        from jaxinfer.runner.batch import StepInputs
        from jaxinfer.runner.buckets import Bucket

        who = "the leader (process 0)" if pid == 0 else f"process {pid}"
        while True:
            try:
                msg = recv_msg(sock)
            except socket.timeout:
                if self.stopping:
                    return
                peer_failure.fail(f"no heartbeat from {who} for {HEARTBEAT_TIMEOUT_S:g} s: taking it for dead")
            except OSError as e:
                msg = None
                logger.debug("stream from %s: %s", who, e)
            if msg is None:
                if self.stopping or peer_failure.failing():
                    return
                peer_failure.fail(f"{who} is gone (its connection closed: it exited or was killed)")
            header, arrays = msg
            kind = header["kind"]
            if kind == "step":
                self._steps.put(StepInputs.from_arrays(Bucket(*header["bucket"]), arrays))
            elif kind == "stop":
                self.stopping = True
                self._steps.put(None)
            elif kind == "error" and self.announced_failure:
                logger.info("%s is ending too: %s", who, header.get("reason", "?"))
                return
            elif kind == "error":
                peer_failure.fail(f"{who} failed: {header.get('reason', '?')}")


def _accept_followers(client, n: int, host: str, timeout: float) -> dict[int, socket.socket]:
    server = socket.create_server(("", 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=n)
    server.settimeout(timeout)
    client.key_value_set(PORT_KEY, str(server.getsockname()[1]))
    peers: dict[int, socket.socket] = {}
    try:
        while len(peers) < n:
            conn, _ = server.accept()
            conn.settimeout(timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = recv_msg(conn)
            if hello is None or hello[0].get("kind") != "hello":
                conn.close()
                continue
            peers[int(hello[0]["process"])] = conn
    except socket.timeout as e:
        raise TimeoutError(f"only {len(peers)} of {n} followers connected within {timeout:g} s") from e
    finally:
        server.close()
    return peers


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=10)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not reach the leader at {host}:{port}") from None
            time.sleep(0.2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
