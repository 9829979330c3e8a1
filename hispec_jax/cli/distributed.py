"""The multi-host flags of `generate`, `serve`, `bench`, `train-heads` and `pretrain`:
one process per host, every process running the same command over the global device mesh
(`hispec_jax.distributed`; docs/tpu.md, "Several hosts").

    --coordinator-address HOST:PORT --num-processes N --process-id I   (GPU hosts, any cluster)
    --distributed                                  (Cloud TPU, Slurm, Open MPI: JAX finds them)
    --heartbeat-timeout SECONDS                    (how soon a dead process stops the others)

The names are `jax.distributed.initialize`'s. The flags are checked before JAX is imported
(`distributed_arg`: a one-line error, exit status 2), and `initialize` joins the processes
before the command's first computation. A command that adds these flags calls the two
functions and nothing else; it prints and writes files on process 0 only
(`hispec_jax.distributed.is_leader`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

FLAGS = ("--coordinator-address", "--num-processes", "--process-id")


@dataclass(frozen=True)
class Distributed:
    """The multi-host arguments as given (None: detected by JAX, under --distributed)."""

    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None
    heartbeat_timeout: int | None = None  # seconds (None: JAX's default)


def add_distributed_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "several hosts", "one process per host, each running this same command over the "
                         "global device mesh (--mesh counts every host's devices); output on "
                         "process 0 only (docs/tpu.md)")
    group.add_argument("--coordinator-address", default=None, metavar="HOST:PORT",
                       help="process 0's address and a free port, the same on every process "
                            "(needs --num-processes and --process-id)")
    group.add_argument("--num-processes", type=int, default=None, metavar="N",
                       help="how many processes (hosts) take part")
    group.add_argument("--process-id", type=int, default=None, metavar="I",
                       help="this process's index, 0..N-1 (process 0 prints the output)")
    group.add_argument("--heartbeat-timeout", type=int, default=None, metavar="SECONDS",
                       help="a process silent this long counts as dead and the others stop "
                            "with an error instead of waiting for it (default: JAX's, 100)")
    group.add_argument("--distributed", action="store_true",
                       help="join the other hosts with the arguments JAX detects (Cloud TPU "
                            "VMs, Slurm, Open MPI); explicit flags above override them")


def distributed_arg(args, needs_mesh: bool = False) -> Distributed | None:
    """The checked multi-host flags, or None when none is given. Without JAX; raises
    ValueError naming the flag: a partial set without --distributed, --process-id without
    --num-processes or out of range, a count below 1, an address that is not HOST:PORT;
    with `needs_mesh`, a run without --mesh (a multi-host run spans several hosts' devices,
    which only a mesh does)."""
    given = Distributed(args.coordinator_address, args.num_processes, args.process_id,
                        args.heartbeat_timeout)
    named = (given.coordinator_address, given.num_processes, given.process_id)
    explicit = [flag for flag, value in zip(FLAGS, named) if value is not None]
    if not explicit and not args.distributed:
        if given.heartbeat_timeout is not None:
            raise ValueError("--heartbeat-timeout: only with the multi-host flags "
                             "(--coordinator-address ..., or --distributed)")
        return None
    if given.heartbeat_timeout is not None and given.heartbeat_timeout < 1:
        raise ValueError(f"--heartbeat-timeout {given.heartbeat_timeout}: must be an integer "
                         ">= 1")
    from hispec_jax import distributed  # standard library at import

    try:
        distributed.check_arguments(*named)
    except distributed.ArgumentError as e:
        flag = "--" + e.argument.replace("_", "-")
        reason = e.reason
        for name in ("num_processes", "process_id"):
            reason = reason.replace(name, "--" + name.replace("_", "-"))
        raise ValueError(f"{flag} {e.value}: {reason}") from None
    if not args.distributed and len(explicit) < len(FLAGS):
        missing = [f for f in FLAGS if f not in explicit]
        raise ValueError(f"{explicit[0]}: also give {' and '.join(missing)} (all three "
                         "together), or --distributed to let JAX detect them (Cloud TPU, "
                         "Slurm, Open MPI)")
    if needs_mesh and getattr(args, "mesh", None) is None:
        raise ValueError(f"{explicit[0] if explicit else '--distributed'}: a run over several "
                         "hosts decodes over a device mesh: give --mesh data=D,model=M, the "
                         "sizes multiplying to every host's devices together (docs/tpu.md)")
    return given


def initialize(spec: Distributed | None) -> None:
    """Joins the other processes (`hispec_jax.distributed.initialize`); nothing for None.
    Runs before the command's first computation (and before `common.use_mesh`, whose mesh
    counts every process's devices)."""
    if spec is None:
        return
    from hispec_jax import distributed

    timeout = {} if spec.heartbeat_timeout is None else {
        "heartbeat_timeout_seconds": spec.heartbeat_timeout}
    distributed.initialize(spec.coordinator_address, spec.num_processes, spec.process_id,
                           **timeout)


def is_leader() -> bool:
    """Whether this process prints the command's output (True on one host)."""
    from hispec_jax import distributed

    return distributed.is_leader()
