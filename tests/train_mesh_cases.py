"""Exit-head training over meshes of four fake CPU devices, run as its own process by
tests/test_train_mesh.py (XLA_FLAGS must be set before JAX starts). Prints one JSON object:

    one, mesh_2x2, mesh_2x2_tokens    the loss of every step: one device (feature cache),
                                      data=2,model=2 with the cache and without it
    stopped_at, resumed               a data=2,model=2 run stopped after step 4 and resumed
                                      on model=4: the steps it resumed at and their losses
    heads_gap                         largest |difference| of the resumed run's final heads
                                      from the unbroken data=2,model=2 run's
    restore                           the stopped run's checkpoint restored onto data=4 and
                                      onto data=2,model=2: bitwise equal, and the shardings
    batch_error                       the error of a batch the data axis does not divide

    python tests/train_mesh_cases.py WORKDIR
"""

import json
import os
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from hispec_jax.models import sharding  # noqa: E402
from hispec_jax.models.config import ModelConfig  # noqa: E402
from hispec_jax.models.model import Model, save_model  # noqa: E402
from hispec_jax.models.params import ParamSpec, param_specs  # noqa: E402
from hispec_jax.train_heads import config as config_lib  # noqa: E402
from hispec_jax.train_heads import mesh as mesh_lib  # noqa: E402
from hispec_jax.train_heads import steps  # noqa: E402
from hispec_jax.train_heads.checkpoint import Checkpointer, abstract_like  # noqa: E402
from hispec_jax.train_heads.train import CHECKPOINT_SUBDIR, train  # noqa: E402

# tests/test_train_heads.py's tiny model: vocabulary 96 and 2 query heads divide the model
# axis of 2 (and the vocabulary 4); its one KV head is replicated
TINY = ModelConfig(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=64,
                   num_layers=4, num_heads=2, num_kv_heads=1, head_dim=16,
                   max_position_embeddings=64)
STEPS = 8


class Stop(Exception):
    """Ends a run from its log, as a kill would (synchronous checkpoints: nothing pending)."""


def model_dir(root: Path) -> Path:
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: np.ones(s.shape, np.float32) if s.init == "ones"
        else (0.3 * rng.standard_normal(s.shape)).astype(np.float32),
        param_specs(TINY), is_leaf=lambda x: isinstance(x, ParamSpec))
    save_model(Model(cfg=TINY, params=params, generation_config={"eos_token_id": 2}),
               root / "model")
    return root / "model"


def run(root: Path, name: str, mesh_text: str | None, stop_at: int | None = None, **overrides):
    config = config_lib.load_config("train_heads_small", {"model_path": str(root / "model")})
    config.update({"workdir": str(root / name), "cache_dir": str(root / "cache"),
                   "output_dir": str(root / name / "out"), "progress_bar": False,
                   "total_steps": STEPS, "warmup_steps": 2, "batch_size": 4,
                   "checkpoint_every": 2, "eval_every": 4, "async_checkpoint": False,
                   **overrides})

    def log(line):
        if stop_at is not None and line.startswith(f"eval @ step {stop_at}:"):
            raise Stop

    mesh = sharding.make_mesh(mesh_text) if mesh_text else None
    try:
        return train(config, log=log, mesh=mesh)
    except Stop:
        return None


def main() -> int:
    root = Path(sys.argv[1])
    model_dir(root)
    try:  # refused before the model loads
        run(root, "odd", "data=2,model=2", batch_size=3)
        batch_error = None
    except ValueError as e:
        batch_error = str(e)
    one = run(root, "one", None)
    mesh = run(root, "mesh", "data=2,model=2")
    tokens = run(root, "tokens", "data=2,model=2", feature_cache=False)
    # stopped after 4 steps on data=2,model=2, resumed on model=4 (the same workdir)
    assert run(root, "resume", "data=2,model=2", stop_at=4) is None
    ckpt = Checkpointer(root / "resume" / CHECKPOINT_SUBDIR)
    stopped_at = ckpt.latest_step()
    restored = {}
    for mesh_text in ("data=4", "data=2,model=2"):
        # the restore target as `train` builds it on that mesh: heads placed by the rule
        # table, the optimizer state initialized from them
        heads = mesh_lib.place_heads(TINY, jax.tree.map(np.asarray, mesh.heads),
                                     sharding.make_mesh(mesh_text))
        opt = steps.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, total_steps=1)
        target = jax.jit(lambda h: steps.init_state(h, steps.make_optimizer(opt), 0))(heads)
        restored[mesh_text], _ = ckpt.restore(stopped_at, abstract_like(target))
    ckpt.close()
    a, b = (jax.tree.leaves(restored[m]["heads"]) for m in ("data=4", "data=2,model=2"))
    restore = {
        "equal": all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b)),
        "specs": sorted({f"{m}: {x.sharding.spec}" for m in restored
                         for x in jax.tree.leaves(restored[m]["heads"])}),
        "meshes": sorted({str(dict(x.sharding.mesh.shape)) for m in restored
                          for x in jax.tree.leaves(restored[m]["heads"])}),
    }
    resumed = run(root, "resume", "model=4")
    gap = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
              for x, y in zip(jax.tree.leaves(resumed.heads), jax.tree.leaves(mesh.heads)))
    print(json.dumps({
        "one": [one.losses[s] for s in range(STEPS)],
        "mesh_2x2": [mesh.losses[s] for s in range(STEPS)],
        "mesh_2x2_tokens": [tokens.losses[s] for s in range(STEPS)],
        "stopped_at": stopped_at, "resumed_start": resumed.start_step,
        "resumed": {str(s): v for s, v in resumed.losses.items()},
        "heads_gap": gap, "restore": restore,
        "eval_one": one.eval, "eval_mesh": mesh.eval, "batch_error": batch_error,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
