"""Head training over a device mesh ("data", "model"): where each array of a run lives.

    frozen base     tensor parallel over "model" (`models.sharding`'s rule table, as decoding)
    exit heads      by the same table: their vocabulary columns over "model" where it divides
                    the columns, else replicated; the optimizer state follows the heads
    token rows      batch over "data" (each data shard trains on its rows; gradients are
                    summed across "data" by XLA's partitioner)
    features        batch over "data": the feature pass's output and the cached features read
                    back from disk (each process places only its own devices' rows)
    step, rng       replicated

The steps themselves are the single-device ones (`steps.py`), jitted under `jax.set_mesh`
so the model's sharding hints apply; XLA's SPMD partitioner derives the rest. The math is
the same on any mesh, up to the order of floating-point sums. Orbax checkpoints are sharded
(each process writes its shards) and restore onto whatever mesh the resuming run has
(`checkpoint.abstract_like` carries the target shardings).

Over several processes (`hispec_jax.distributed`) every process runs the same training
loop on the global mesh; process 0 alone writes the metrics log and the heads.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hispec_jax.models import sharding


def check_batch(batch_size: int, mesh: Mesh | None) -> None:
    """Raises ValueError unless the mesh's data axis divides the batch (rows are never
    replicated or padded in training)."""
    data = sharding.axis_size(mesh, "data")
    if batch_size % data:
        raise ValueError(f"batch_size={batch_size} is not a multiple of the mesh's data axis "
                         f"({data}): every data shard trains on the same number of rows")


def place_batch(tree: Any, mesh: Mesh | None) -> Any:
    """Host arrays with a leading batch axis placed over "data" (each process places its own
    devices' rows); on one device, `jax.device_put`."""
    if mesh is None:
        return jax.device_put(tree)
    return sharding.shard_arrays(tree, jax.tree.map(
        lambda x: NamedSharding(mesh, PartitionSpec("data")), tree))


def place_heads(cfg, heads, mesh: Mesh | None):
    """Exit heads placed by the rule table (unchanged on one device)."""
    if mesh is None:
        return heads
    return sharding.shard_arrays(heads, sharding.heads_shardings(cfg, heads, mesh))


def is_leader() -> bool:
    """Whether this process writes the run's files (process 0; always on one host)."""
    return jax.process_index() == 0
