"""Orbax checkpoints of head training: heads, optimizer state, data position and RNG.

One `ocp.CheckpointManager` directory; checkpoint `n` holds the state after `n` completed
steps as two items:

    state   StandardSave   {"step": int32 [], "heads": ExitHeads (float32),
                            "opt_state": the optax state, "rng": uint32 key data}
    meta    JsonSave       {"step": n, "data_position": n (next batch index),
                            "run": the settings a resumed run must agree with}

Arrays are saved sharded (orbax writes each shard once, from the process that holds it) and
restored into the shardings of the target the resuming run passes (`abstract_like`), whatever
mesh wrote them.

Saves are asynchronous (orbax writes to a temporary directory and renames it when done), so
a run killed with SIGKILL mid-save leaves the previous checkpoint as the latest complete one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    """Periodic, asynchronous checkpoints of a training state pytree in `directory`."""

    def __init__(self, directory, max_to_keep: int | None = 2, async_save: bool = True):
        self.directory = Path(directory).expanduser().resolve()
        # cleanup_tmp_directories: a save cut off by a kill leaves a temporary directory;
        # it is removed when the next run opens the manager.
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                               enable_async_checkpointing=async_save,
                                               cleanup_tmp_directories=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint, or None."""
        return self._manager.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Starts saving `state` (a pytree of arrays) and `meta` (JSON) as checkpoint `step`."""
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """(state, meta) of checkpoint `step`; `abstract_state` gives structure and dtypes."""
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        return restored["state"], dict(restored["meta"])

    def wait(self) -> None:
        """Blocks until pending saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


def abstract_like(tree: Any) -> Any:
    """`jax.ShapeDtypeStruct`s of a pytree of arrays, with their shardings (a restore
    target: orbax reads each array straight into these shardings, so a checkpoint written
    on one device mesh restores onto another, each process reading only its shards)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                       sharding=getattr(x, "sharding", None)),
                        tree)
