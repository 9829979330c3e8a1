"""`hispec pretrain --small` over meshes of four fake CPU devices, run as its own process by
tests/test_train_mesh.py (XLA_FLAGS must be set before JAX starts). Prints one JSON object:

    one, mesh_2x2          the loss of every step: one device, data=2,model=2
    cut_steps, resumed     a data=2,model=2 run cut after its first step (its sharded orbax
                           checkpoint), resumed on model=4: steps done each time, the losses
    params_gap             largest |difference| of the resumed run's saved weights from the
                           unbroken data=2,model=2 run's

    python tests/pretrain_mesh_cases.py WORKDIR
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

from hispec_jax.cli import main as cli_main  # noqa: E402
from hispec_jax.models.model import load_model  # noqa: E402

STEPS = 6


def run(root: Path, name: str, mesh: str | None, *overrides: str) -> dict:
    work = root / name
    argv = ["pretrain", "--small", "--no-progress", f"--config.work_dir={work}",
            f"--config.out_dir={work / 'model'}", f"--config.num_steps={STEPS}",
            "--config.log_every=1", "--config.eval_batches=1", "--config.data.max_train_docs=60",
            "--config.data.max_eval_docs=8", "--config.data.tokenizer_train_docs=60",
            *(["--mesh", mesh] if mesh else []), *overrides]
    assert cli_main(argv) == 0
    lines = (work / "metrics.jsonl").read_text().splitlines()
    summary = json.loads((work / "model" / "training_summary.json").read_text())
    return {"losses": {json.loads(line)["step"]: json.loads(line)["loss"] for line in lines},
            "steps": summary["steps"], "steps_this_run": summary["steps_this_run"],
            "perplexity": summary["eval"]["perplexity"]}


def main() -> int:
    root = Path(sys.argv[1])
    one = run(root, "one", None)
    mesh = run(root, "mesh", "data=2,model=2")
    cut = run(root, "resume", "data=2,model=2", "--config.checkpoint_every=1",
              "--config.time_limit_s=1e-9")
    resumed = run(root, "resume", "model=4", "--config.resume=True")
    a, b = (load_model(root / name / "model") for name in ("mesh", "resume"))
    gap = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
              for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))
    print(json.dumps({
        "one": [one["losses"][s] for s in range(STEPS)],
        "mesh_2x2": [mesh["losses"][s] for s in range(STEPS)],
        "perplexity": [one["perplexity"], mesh["perplexity"]],
        "cut_steps": cut["steps"], "resumed_steps": resumed["steps_this_run"],
        "resumed": {str(s): v for s, v in resumed["losses"].items()},
        "params_gap": gap,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
