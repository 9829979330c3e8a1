"""`train`: distill exit heads into a frozen model (HiSpec App. I).

    config = hispec_jax.train_heads.config.load_config("configs/train_heads_small.py",
                                                       {"model_path": "/path/to/model"})
    result = hispec_jax.train_heads.train.train(config)
    hispec_jax.load_model(result.output_dir).heads      # the trained heads

Pipeline: token rows (`rows.py`) -> frozen-base features, either computed in every step or
read from the on-disk cache (`features.py`, `config.feature_cache`) -> KL distillation at
temperature T (`losses.py`) -> optax update of the heads only (`steps.py`). Orbax
checkpoints (`checkpoint.py`) every `checkpoint_every` steps; a restarted run resumes from
the newest complete one and continues with the same batches, so its losses equal an
uninterrupted run's. Held-out evaluation every `eval_every` steps and at the end reports
per exit the top-1 agreement with the final layer (the greedy acceptance rate) and the KL.

`<workdir>/metrics.jsonl` gets one JSON object per line: `{"event": "train", "step": s,
"loss", "kl": {exit: ...}, "top1": {exit: ...}, "grad_norm", "lr"}` for the batch of step s
(0-based), `{"event": "eval", "step": n, "exits": {exit: {"top1_agreement", "kl"}}}` after n
steps, and a final `{"event": "summary", ...}` with throughput. A resumed run first drops the
lines of steps at or after its checkpoint, so the file always describes one clean run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax.models import hf_io, sharding
from hispec_jax.models.model import Model, load_model, place_on_mesh, save_model
from hispec_jax.models.params import ExitHeads, with_layer_layout
from hispec_jax.train_heads import mesh as mesh_lib
from hispec_jax.train_heads import steps
from hispec_jax.train_heads.checkpoint import Checkpointer, abstract_like
from hispec_jax.train_heads.config import check_config
from hispec_jax.train_heads.features import FeatureCache, bytes_per_row, compute_features
from hispec_jax.train_heads.heads import (check_head_layers, check_rank, init_heads,
                                         shared_head_params)
from hispec_jax.train_heads.rows import RowOrder, TokenRows, load_rows

METRICS_FILENAME = "metrics.jsonl"
CHECKPOINT_SUBDIR = "checkpoints"
# Settings a resumed run must share with its checkpoint (anything else may change).
RESUME_KEYS = ("head_layers", "head_rank", "head_adapter_width", "head_adapter_act",
               "head_projection", "temperature", "target_top_k", "loss", "learning_rate",
               "end_lr_fraction", "warmup_steps", "weight_decay", "adam_b1", "adam_b2",
               "adam_eps", "grad_clip_norm", "batch_size", "seq_len", "data_source", "seed",
               "max_train_docs", "random_train_rows", "on_policy_prompts",
               "on_policy_new_tokens", "on_policy_sampling", "on_policy_temperature")
# The value a key takes when a checkpoint's recorded run settings lack it.
RESUME_DEFAULTS = {"loss": "kl", "head_adapter_width": 0, "head_adapter_act": "swiglu",
                   "head_projection": "own", "on_policy_prompts": 1000,
                   "on_policy_new_tokens": 256, "on_policy_sampling": "greedy",
                   "on_policy_temperature": 1.0}


@dataclasses.dataclass
class TrainResult:
    """What `train` returns.

    Attributes:
      heads: the trained heads (float32).
      losses: training loss of every step this call ran, by step.
      eval: the final held-out metrics {exit: {"top1_agreement", "kl"}}.
      tokens_per_second: training throughput of this call (compilation and evaluation
        excluded; with the feature cache, its build is excluded too).
      cache_build_seconds: time spent building the feature cache (0 when reused or off).
      start_step, total_steps: where this call started (> 0 after a resume) and ended.
      output_dir: where the heads were saved (a directory `load_model` reads).
    """

    heads: ExitHeads
    losses: dict[int, float]
    eval: dict[str, dict[str, float]]
    tokens_per_second: float
    cache_build_seconds: float
    start_step: int
    total_steps: int
    output_dir: str


class MetricsLog:
    """Appends JSON lines to `path`, first dropping lines of steps >= `resume_step`; writes
    nothing unless `enabled` (the processes other than 0 of a multi-host run)."""

    def __init__(self, path: Path, resume_step: int, enabled: bool = True):
        self._file = None
        if not enabled:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if path.exists() and resume_step > 0:
            for line in path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut off by a kill
                    continue
                if record.get("event") in ("train", "eval") and record["step"] < resume_step:
                    kept.append(line)
        path.write_text("".join(f"{line}\n" for line in kept))
        self._file = open(path, "a")

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _train_record(step: int, metrics, head_layers) -> dict[str, Any]:
    m = sharding.host_values(metrics)
    return {"event": "train", "step": step, "loss": float(m["loss"]),
            "kl": {str(e): float(v) for e, v in zip(head_layers, m["kl"])},
            "top1": {str(e): float(v) for e, v in zip(head_layers, m["top1"])},
            "grad_norm": float(m["grad_norm"]), "lr": float(m["lr"])}


def evaluate(heads: ExitHeads, model: Model, rows: np.ndarray, batch_size: int,
             settings: steps.StepSettings) -> dict[str, dict[str, float]]:
    """Held-out per-exit top-1 agreement with the final layer and exact KL (×T²); on the
    model's mesh, the rows split over "data"."""
    sums = None
    for first in range(0, len(rows), batch_size):
        chunk = rows[first:first + batch_size]
        valid = np.arange(batch_size) < len(chunk)
        if len(chunk) < batch_size:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - len(chunk), 0)])
        out = steps.eval_step(heads, model.params,
                              *mesh_lib.place_batch((chunk, valid), model.mesh),
                              settings=settings)
        sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
    sums = sharding.host_values(sums)
    n = float(sums["tokens"])
    return {str(e): {"top1_agreement": float(sums["top1"][i]) / n, "kl": float(sums["kl"][i]) / n}
            for i, e in enumerate(settings.head_layers)}


def save_heads(model: Model, heads: ExitHeads, output_dir: str) -> str:
    """Writes the heads where `load_model` finds them; returns that directory.

    `output_dir` empty (or the model's own directory): `exit_heads.safetensors` is written
    into the model directory. Otherwise the model's files are copied there first (or the
    in-memory model is saved, when it has no directory), then the heads.
    """
    # weights in the model's dtype; a draft vocabulary's token ids stay integers (gathered
    # from every process of a multi-host run: all of them call this, process 0 writes)
    cast = jax.tree.map(lambda x: np.asarray(x if np.issubdtype(x.dtype, np.integer)
                                             else np.asarray(x, model.cfg.dtype)),
                        sharding.host_values(heads))
    source = Path(model.path).resolve() if model.path else None
    target = Path(output_dir).expanduser().resolve() if output_dir else source
    if target is None:
        raise ValueError("output_dir is empty and the model has no directory to save heads in")
    if not mesh_lib.is_leader():
        return str(target)
    if target != source:
        if source is not None:
            target.mkdir(parents=True, exist_ok=True)
            for f in source.iterdir():
                if f.is_file() and f.name != hf_io.HEADS_FILENAME:
                    shutil.copy2(f, target / f.name)
        else:
            save_model(dataclasses.replace(model, heads={}), target)
    hf_io.save_exit_heads(target, model.cfg, cast)
    return str(target)


def _prefetched(fn: Callable[[int], Any], first: int, stop: int):
    """Yields fn(step) for step in [first, stop), computing the next one in a thread."""
    if first >= stop:
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(fn, first)
        for step in range(first, stop):
            batch = future.result()
            if step + 1 < stop:
                future = pool.submit(fn, step + 1)
            yield batch


class Throughput:
    """Training tokens/s from the times steps' metrics arrive: the first step (compilation)
    and any `exclude`d time (evaluation) do not count."""

    def __init__(self, tokens_per_step: int):
        self.tokens_per_step = tokens_per_step
        self.steps, self.first, self.last, self.excluded = 0, None, None, 0.0

    def step_done(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first, self.excluded = now, 0.0
        else:
            self.steps += 1
        self.last = now

    def exclude(self, seconds: float) -> None:
        self.excluded += seconds

    @property
    def tokens_per_second(self) -> float:
        if self.first is None:
            return 0.0
        elapsed = self.last - self.first - self.excluded
        return self.steps * self.tokens_per_step / elapsed if elapsed > 0 else 0.0


def _model_fingerprint(model: Model) -> dict[str, Any]:
    """What identifies the frozen base for the feature cache: its config and weight files."""
    files = {}
    if model.path:
        for f in sorted(Path(model.path).glob("*.safetensors")):
            if f.name != hf_io.HEADS_FILENAME:
                st = f.stat()
                files[f.name] = [st.st_size, st.st_mtime_ns]
    return {"config": model.cfg.to_hf_dict(), "path": str(model.path), "files": files}


def _batch_pipeline(config, model: Model, rows: TokenRows, order: RowOrder,
                    settings: steps.StepSettings, opt: steps.OptimizerSettings, log):
    """(batch(step) -> device batch, run_step(state, batch), cache build seconds)."""
    if not config.feature_cache:
        def batch(step):
            return mesh_lib.place_batch(rows.train[order.rows(step)], model.mesh)

        def run_step(state, b):
            return steps.train_step_tokens(state, model.params, b, settings=settings, opt=opt)
        return batch, run_step, 0.0

    def compute(chunk):  # host arrays (every process gets all rows' features)
        return sharding.host_values(compute_features(
            model.params, mesh_lib.place_batch(chunk, model.mesh), cfg=settings.cfg,
            head_layers=settings.head_layers, temperature=settings.temperature,
            top_k=settings.top_k, hidden_dtype=config.cache_dtype))

    cache_settings = {"model": _model_fingerprint(model), "head_layers": list(settings.head_layers),
                      "temperature": settings.temperature, "top_k": settings.top_k,
                      "hidden_dtype": config.cache_dtype}
    row_bytes = bytes_per_row(settings.cfg, len(settings.head_layers), config.seq_len,
                              settings.top_k, config.cache_dtype)
    cache = FeatureCache.open_or_build(config.cache_dir, cache_settings, rows.train, compute,
                                       config.batch_size, row_bytes,
                                       max_bytes=config.cache_max_gb * 2**30, log=log)

    shared = shared_head_params(model.params, settings.cfg)

    def batch(step):
        return mesh_lib.place_batch(cache.gather(order.rows(step)), model.mesh)

    def run_step(state, b):
        return steps.train_step_cached(state, b, shared, settings=settings, opt=opt)
    return batch, run_step, cache.meta["build_seconds"] if cache.built_now else 0.0


def _resume(ckpt: Checkpointer, state, run_meta: dict[str, Any], log):
    """(state, start step): from the newest complete checkpoint, else as given."""
    latest = ckpt.latest_step()
    if latest is None:
        return state, 0
    state, meta = ckpt.restore(latest, abstract_like(state))
    saved = {**RESUME_DEFAULTS, **meta["run"]}
    mismatched = {k: (saved.get(k), v) for k, v in run_meta.items()
                  if json.loads(json.dumps(v)) != saved.get(k)}
    if mismatched:
        raise ValueError(f"checkpoint {ckpt.directory}/{latest} was written by a different run "
                         f"(checkpoint vs now: {mismatched}); use another workdir or "
                         "--config.resume=False to start over")
    start = int(meta["data_position"])
    log(f"train-heads: resuming from {ckpt.directory} at step {start}/{run_meta['total_steps']}")
    return state, start


def train(config, model: Model | None = None, log: Callable[[str], None] = print,
          mesh=None) -> TrainResult:
    """Runs (or resumes) the head-distillation run `config` describes (module docstring).

    Args:
      config: a train config (`config.load_config`); `config.model_path` is read unless
        `model` is given.
      model: an already loaded model (its parameters are only read).
      log: where progress lines go.
      mesh: a device mesh ("data", "model") to train over (`sharding.make_mesh`; `mesh.py`
        says what is sharded how); None: the given model's mesh, else the mesh set by
        `jax.set_mesh`, if any, else one device. A checkpoint written on one mesh resumes
        on any other.
    """
    if mesh is None:
        mesh = model.mesh if model is not None else None
    if mesh is None and not jax.sharding.get_mesh().empty:
        mesh = jax.sharding.get_mesh()
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        return _train(config, model, log, mesh)


def _train(config, model: Model | None, log: Callable[[str], None], mesh) -> TrainResult:
    from tqdm.auto import tqdm

    check_config(config)
    mesh_lib.check_batch(config.batch_size, mesh)
    if model is None:
        model = load_model(config.model_path, dtype=config.model_dtype or None,
                           layer_layout="scan", mesh=mesh)
    # The feature pass scans the stacked layers.
    model = place_on_mesh(dataclasses.replace(model, params=with_layer_layout(model.params,
                                                                              "scan")), mesh)
    cfg = model.cfg
    head_layers = check_head_layers(cfg, config.head_layers)
    rank = check_rank(cfg, config.head_rank or None)
    if config.seq_len > cfg.max_position_embeddings:
        raise ValueError(f"seq_len={config.seq_len} exceeds the model's "
                         f"max_position_embeddings={cfg.max_position_embeddings}")
    if config.target_top_k > cfg.vocab_size:
        raise ValueError(f"target_top_k={config.target_top_k} exceeds vocab_size={cfg.vocab_size}")

    rows: TokenRows = load_rows(config, model, log)
    if len(rows.train) < config.batch_size:
        raise ValueError(f"{len(rows.train)} training rows do not fill one batch of "
                         f"{config.batch_size}")
    if len(rows.eval) == 0:
        raise ValueError(f"no held-out rows of {config.seq_len} tokens for evaluation")
    if config.total_steps and config.total_steps * config.batch_size < len(rows.train):
        # Less than one epoch: keep only the rows the run reads (the packed stream is
        # already shuffled), so the feature cache holds nothing that is never used.
        rows.train = rows.train[:config.total_steps * config.batch_size]
    order = RowOrder(len(rows.train), config.batch_size, config.seed)
    total_steps = config.total_steps or config.num_epochs * order.batches_per_epoch
    opt = steps.OptimizerSettings(
        learning_rate=config.learning_rate, warmup_steps=config.warmup_steps,
        total_steps=total_steps, end_lr_fraction=config.end_lr_fraction,
        weight_decay=config.weight_decay, b1=config.adam_b1, b2=config.adam_b2,
        eps=config.adam_eps, clip_norm=config.grad_clip_norm)
    steps.learning_rate_schedule(opt)  # validates warmup < total
    # the backend's fast default matmul passes for training ("highest" is for decoding)
    settings = steps.StepSettings(cfg=cfg.replace(matmul_precision="default"),
                                  head_layers=head_layers,
                                  temperature=float(config.temperature), top_k=config.target_top_k,
                                  loss=config.loss)
    adapter = dict(adapter_width=config.head_adapter_width or None,
                   adapter_act=config.head_adapter_act, projection=config.head_projection)
    heads = mesh_lib.place_heads(cfg, init_heads(model.params, cfg, head_layers, rank,
                                                 **adapter, seed=config.seed), mesh)
    if mesh is None:
        state = steps.init_state(heads, steps.make_optimizer(opt), config.seed)
    else:  # on the mesh: the optimizer state sharded as the heads, the rest replicated
        state = jax.jit(lambda h: steps.init_state(h, steps.make_optimizer(opt),
                                                   config.seed))(heads)

    workdir = Path(config.workdir).expanduser()
    ckpt_dir = workdir / CHECKPOINT_SUBDIR
    if not config.resume and ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)
    ckpt = Checkpointer(ckpt_dir, max_to_keep=config.keep_checkpoints,
                        async_save=config.async_checkpoint)
    run_meta = {k: (list(config[k]) if isinstance(config[k], tuple) else config[k])
                for k in RESUME_KEYS}
    run_meta.update(total_steps=total_steps, model=cfg.to_hf_dict())
    state, start = _resume(ckpt, state, run_meta, log)
    metrics_log = MetricsLog(workdir / METRICS_FILENAME, resume_step=start,
                             enabled=mesh_lib.is_leader())

    tokens_per_step = config.batch_size * config.seq_len
    kind = ("shared-projection" if config.head_projection == "shared"
            else f"low-rank (rank {rank})" if rank else "full")
    if config.head_adapter_width:
        kind += f" {config.head_adapter_act} adapter (width {config.head_adapter_width})"
    log(f"train-heads: {len(head_layers)} {kind} heads at exits {list(head_layers)}; "
        f"{rows.source}, {len(rows.train)} rows used; {total_steps} steps of "
        f"{tokens_per_step} tokens; feature_cache={config.feature_cache}; "
        f"{sharding.describe(mesh)}")
    batch, run_step, cache_build_seconds = _batch_pipeline(config, model, rows, order, settings,
                                                           opt, log)

    # ---- the loop: metrics are fetched one step late so dispatch never waits ----
    bar = tqdm(total=total_steps, initial=start, unit="step", dynamic_ncols=True,
               disable=not config.progress_bar)
    throughput = Throughput(tokens_per_step)
    losses: dict[int, float] = {}
    last_eval: dict[str, dict[str, float]] = {}

    def run_eval(at_step):
        nonlocal last_eval
        t0 = time.perf_counter()
        last_eval = evaluate(state["heads"], model, rows.eval, config.batch_size, settings)
        metrics_log.write({"event": "eval", "step": at_step, "exits": last_eval})
        log(f"eval @ step {at_step}: " + ", ".join(
            f"exit {e}: top-1 {m['top1_agreement']:.3f} KL {m['kl']:.4f}"
            for e, m in last_eval.items()))
        throughput.exclude(time.perf_counter() - t0)

    def flush(step, metrics):
        record = _train_record(step, metrics, head_layers)
        metrics_log.write(record)
        losses[step] = record["loss"]
        throughput.step_done()
        bar.update(1)
        bar.set_postfix(loss=f"{record['loss']:.4f}",
                        tok_s=f"{throughput.tokens_per_second:,.0f}")

    pending = None
    for step, b in zip(range(start, total_steps), _prefetched(batch, start, total_steps)):
        if config.eval_every and step % config.eval_every == 0:
            if pending is not None:
                flush(*pending)
                pending = None
            run_eval(step)
        state, metrics = run_step(state, b)
        if pending is not None:
            flush(*pending)
        pending = (step, metrics)
        done = step + 1
        if done % config.checkpoint_every == 0 or done == total_steps:
            ckpt.save(done, state, {"step": done, "data_position": done, "run": run_meta})
    if pending is not None:
        flush(*pending)
    bar.close()
    tokens_per_second = throughput.tokens_per_second
    run_eval(total_steps)
    ckpt.wait()
    ckpt.close()

    output_dir = save_heads(model, state["heads"], config.output_dir)
    metrics_log.write({"event": "summary", "start_step": start, "total_steps": total_steps,
                       "tokens_per_second": tokens_per_second,
                       "feature_cache": config.feature_cache,
                       "cache_build_seconds": cache_build_seconds, "output_dir": output_dir})
    metrics_log.close()
    log(f"train-heads: steps {start}..{total_steps}, {tokens_per_second:,.0f} tokens/s "
        f"(feature_cache={config.feature_cache}"
        + (f", cache built in {cache_build_seconds:.1f} s" if cache_build_seconds else "")
        + f"); heads saved to {output_dir}")
    return TrainResult(heads=state["heads"], losses=losses, eval=last_eval,
                       tokens_per_second=tokens_per_second,
                       cache_build_seconds=cache_build_seconds, start_step=start,
                       total_steps=total_steps, output_dir=output_dir)
