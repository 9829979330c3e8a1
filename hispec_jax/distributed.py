"""Several hosts, one program: JAX's multi-controller runtime for `hispec`.

A pod slice larger than one host (a v5e-16, a v4-16, several GPU boxes) runs one process
per host; every process runs the same program over the global device mesh and holds only
its own devices' shards (SPMD). `initialize` joins this process to the others, after which
`jax.devices()` lists every host's devices and `sharding.make_mesh` builds the global mesh
from them:

    import hispec_jax
    hispec_jax.distributed.initialize()               # Cloud TPU: JAX finds the arguments
    hispec_jax.distributed.initialize("10.0.0.1:1234", num_processes=2, process_id=0)  # GPU
    model = hispec_jax.load_model(path, mesh=sharding.make_mesh("data=2,model=4"))
    result = hispec_jax.generate(model, prompts)      # same prompts on every process
    if hispec_jax.distributed.is_leader(): print(result.texts)

On CPU the processes talk over gloo (`jax_cpu_collectives_implementation`, JAX's default),
which is how the two-process tests run on one machine (tests/test_multihost.py).

`broadcast_work` sends host-side work (a JSON value: a request, a step's slot plan) from
process 0 to the followers, so that every process can run the same compiled programs on
the same arguments: `hispec serve` on several hosts sends each slot-engine call through it
(process 0 takes the HTTP requests; `hispec_jax/serving/follower.py`). A process that dies stops the others instead of leaving them waiting: JAX's
coordination service notices its missing heartbeats (`heartbeat_timeout_seconds`) and
terminates every other process with "Terminating process because the JAX distributed
service detected fatal errors. This most likely indicates that another task died"
(tests/test_multihost.py).

Standard library and JAX only; nothing here imports the rest of the package.
"""

from __future__ import annotations

import json
from typing import Any

LEADER = 0  # the process that prints, writes files and takes requests


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids=None, *,
               initialization_timeout: int = 300, heartbeat_timeout_seconds: int = 100,
               **kwargs) -> None:
    """Joins this process to the multi-controller run (`jax.distributed.initialize`, same
    argument names); must run before JAX starts its backend (before any computation).

    Args:
      coordinator_address: "HOST:PORT" of process 0's coordination service, the same on
        every process; None on Cloud TPU, Slurm or Open MPI, where JAX detects it (and
        `num_processes`, `process_id`) from the environment.
      num_processes: how many processes take part.
      process_id: this process's index, 0..num_processes-1; process 0 hosts the service.
      local_device_ids: the local devices this process uses (default: all of them).
      initialization_timeout: seconds to wait for the other processes to join.
      heartbeat_timeout_seconds: after this long without a heartbeat from a process, the
        others are terminated with JAX's error (a dead follower stops the run instead of
        hanging it).
      **kwargs: passed on to `jax.distributed.initialize` (e.g. `cluster_detection_method`).

    Raises `ArgumentError` (a ValueError) for a process id outside [0, num_processes) or a
    coordinator address without a port, before contacting anyone.
    """
    check_arguments(coordinator_address, num_processes, process_id)
    import jax

    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               local_device_ids=local_device_ids,
                               initialization_timeout=initialization_timeout,
                               heartbeat_timeout_seconds=heartbeat_timeout_seconds, **kwargs)


class ArgumentError(ValueError):
    """A bad explicit argument of `initialize`: `argument` (its name), `value` and `reason`."""

    def __init__(self, argument: str, value, reason: str):
        self.argument, self.value, self.reason = argument, value, reason
        super().__init__(f"{argument}={value!r}: {reason}")


def check_arguments(coordinator_address: str | None, num_processes: int | None,
                    process_id: int | None) -> None:
    """Raises `ArgumentError` (a ValueError) naming the argument when the explicit arguments
    cannot work: a process id without a process count (or one out of range), a count below
    1, a coordinator address that is not HOST:PORT with a port in 1..65535. All None is
    valid (the arguments are detected: Cloud TPU, Slurm, Open MPI)."""
    if num_processes is not None and (not isinstance(num_processes, int) or num_processes < 1):
        raise ArgumentError("num_processes", num_processes, "must be an integer >= 1")
    if process_id is not None:
        if num_processes is None:
            raise ArgumentError("process_id", process_id,
                                "needs num_processes (how many processes take part)")
        if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
            raise ArgumentError("process_id", process_id,
                                f"must be in 0..{num_processes - 1} (num_processes="
                                f"{num_processes})")
    if coordinator_address is not None:
        host, sep, port = coordinator_address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ArgumentError("coordinator_address", coordinator_address,
                                "must be HOST:PORT with a port in 1..65535 (process 0's "
                                "host and a free port)")


def process_index() -> int:
    import jax

    return jax.process_index()


def process_count() -> int:
    import jax

    return jax.process_count()


def is_leader() -> bool:
    """Whether this process prints results and writes files (process 0; True on one host)."""
    return process_index() == LEADER


# Bytes of a message that travel in its first collective, with its length: every call the
# server sends but a long prompt's admission fits, so a call costs one collective.
INLINE_BYTES = 1024


def broadcast_work(work: Any = None) -> Any:
    """`work` (a JSON value) from process 0, returned on every process; the followers' own
    argument is ignored (pass None). One process: `work` itself, without a collective.

    One collective (`multihost_utils.broadcast_one_to_all`) carries the encoded length and
    the first `INLINE_BYTES` bytes; a longer message sends the rest in a second, padded to
    a power of two (so followers compile one program per size class, not one per message).
    Every process must call it the same number of times, in the same order. A dead peer
    ends the process within the heartbeat timeout (module docstring) instead of leaving it
    waiting for ever."""
    import numpy as np

    if process_count() == 1:
        return work
    from jax.experimental import multihost_utils

    leader = is_leader()
    data = json.dumps(work).encode() if leader else b""
    head = np.zeros(8 + INLINE_BYTES, np.uint8)
    if leader:
        head[:8] = np.frombuffer(np.int64(len(data)).tobytes(), np.uint8)
        head[8:8 + min(len(data), INLINE_BYTES)] = np.frombuffer(data[:INLINE_BYTES], np.uint8)
    head = np.asarray(multihost_utils.broadcast_one_to_all(head, is_source=leader))
    size = int(head[:8].copy().view(np.int64)[0])
    body = head[8:8 + min(size, INLINE_BYTES)].tobytes()
    if size > INLINE_BYTES:
        rest = size - INLINE_BYTES
        buffer = np.zeros(1 << (rest - 1).bit_length(), np.uint8)
        if leader:
            buffer[:rest] = np.frombuffer(data[INLINE_BYTES:], np.uint8)
        received = multihost_utils.broadcast_one_to_all(buffer, is_source=leader)
        body += np.asarray(received)[:rest].tobytes()
    return json.loads(body.decode())
