"""Pretraining an early-exit model with a LayerSkip-style early-exit loss, from scratch or
continued from an existing model (`init_from`).

The shared exit head (the model's final norm + LM head) is supervised at every layer's
output, so every exit `e` can draft. The loss (`exit_recipe`, float32) is

    loss = CE_L + sum_{e<L, active} w_e [(1 - distill_weight) CE_e + distill_weight KL_e]

with exit weights `w_e` per `exit_weights` (linear in e, uniform or sqrt; summing to
`exit_loss_scale`, restricted to `exit_layers`), a curriculum choosing the active exits
(none, LayerSkip's rotational or gradual), `KL_e` the distillation of exit e from the final
layer's distribution, and optional LayerSkip layer dropout. `exit_recipe` documents each.

Pipeline (`pretrain`): ShareGPT training split -> byte-level BPE tokenizer (or the
`init_from` model's) -> cached token ids (or, with `data.source="on_policy"`, the `init_from`
model's own greedy or sampled continuations of ShareGPT training prompts, generated once by
the engine before training: `on_policy.py`; `"mixed"`: both) -> `PackedBatches` -> jitted
AdamW steps (clip_by_global_norm; linear warmup, then a cosine over training progress: steps /
num_steps, or elapsed / time_budget_s when a wall-clock budget is set and that is further
along) -> held-out evaluation (perplexity, per-exit top-1 agreement with the final layer,
over all held-out tokens and over the assistant replies only) -> a HF directory
(`save_model` + tokenizer + generation_config.json). The training state is checkpointed
with orbax to `work_dir/checkpoints` so an interrupted run resumes at the same batch.

Over a device mesh (`pretrain(..., mesh=)`, `hispec pretrain --mesh data=D,model=M`) the
parameters and their optimizer state are sharded by `models.sharding`'s rule table (tensor
parallel over "model"; created shard by shard, never whole on one device), the batches
split over "data"; checkpoints are sharded and restore onto any mesh
(`train_heads/mesh.py`). Over several processes every process runs the same loop; process 0
writes the metrics, the summary and the model.

Shapes: B batch, T sequence length, D hidden, V vocab, L layers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from hispec_jax import datasets
from hispec_jax.models import sharding
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.model import Model, load_model, save_model
from hispec_jax.models.params import Params, init_params
from hispec_jax.models.presets import model_config_from_ml_collections
from hispec_jax.models.transformer import scan_exits
from hispec_jax.train_heads import data, exit_recipe, on_policy
from hispec_jax.train_heads import mesh as mesh_lib
from hispec_jax.train_heads.checkpoint import Checkpointer, abstract_like

log = logging.getLogger(__name__)

CHECKPOINT_SUBDIR = "checkpoints"
SUMMARY_FILENAME = "training_summary.json"
PACKAGE_DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[1] / "default_model"


# ----- optimizer and train step --------------------------------------------------------

@flax.struct.dataclass
class TrainState:
    """step: [] int32; elapsed_s: [] float32 training seconds so far (all runs); params;
    opt_state: the optax state."""

    step: jax.Array
    elapsed_s: jax.Array
    params: Params
    opt_state: Any


def frozen_names(optim: ml_collections.ConfigDict, params: Params) -> tuple[str, ...]:
    """The top-level parameter groups `optim.frozen` names ("embed,final_norm": comma
    separated; "" trains everything); an unknown name raises, naming the groups there are."""
    names = tuple(n.strip() for n in str(optim.get("frozen", "")).split(",") if n.strip())
    unknown = [n for n in names if n not in params]
    if unknown:
        raise ValueError(f"optim.frozen: {unknown} are not parameter groups of this model "
                         f"(it has {sorted(params)})")
    return names


def make_optimizer(optim: ml_collections.ConfigDict,
                   params: Params | None = None) -> optax.GradientTransformation:
    """chain(clip_by_global_norm, AdamW at learning rate 1); no weight decay on norms. The
    groups named by `optim.frozen` (e.g. "embed": a tied embedding / LM head) get zero
    updates and no optimizer state, so the exits have to come to the head instead of the
    head moving towards the exits.

    The learning rate multiplies the updates in the train step (`learning_rate`), so the
    schedule can follow wall-clock progress under a time budget.
    """
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    tx = optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adamw(1.0, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay,
                    mask=decay_mask))
    frozen = frozen_names(optim, params) if params is not None else ()
    if not frozen:
        return tx
    labels = {k: jax.tree.map(lambda _, k=k: "frozen" if k in frozen else "train", v)
              for k, v in params.items()}
    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def learning_rate(optim: ml_collections.ConfigDict, step: int, progress: float) -> float:
    """Linear warmup over `warmup_steps`, then cosine from `peak_lr` to
    `peak_lr * end_lr_fraction` as training `progress` goes from 0 to 1."""
    warm = min(1.0, (step + 1) / max(optim.warmup_steps, 1))
    cos = 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
    return optim.peak_lr * warm * (optim.end_lr_fraction + (1.0 - optim.end_lr_fraction) * cos)


def training_progress(config: ml_collections.ConfigDict, step: int, elapsed_s: float) -> float:
    """Fraction of the run done: steps / num_steps, or elapsed / time_budget_s if larger."""
    progress = step / config.num_steps
    if config.time_budget_s:
        progress = max(progress, elapsed_s / config.time_budget_s)
    return progress


def make_train_step(cfg: ModelConfig, tx: optax.GradientTransformation,
                    config: ml_collections.ConfigDict):
    """A jitted `(state, batch [B, T+1], lr, weights [L], key data) -> (state, metrics)` for
    the recipe in `config` (`exit_recipe`); the state is donated. The per-step exit weights
    (curriculum) are an argument, so they never recompile; the key (its `key_data`, a plain
    array that places on a mesh like any other) draws the layer dropout."""
    rates_L = jnp.asarray(exit_recipe.layer_dropout_rates(cfg.num_layers,
                                                          config.layer_dropout_max))
    use_dropout = config.layer_dropout_max > 0
    # Only the supervised exits' logits are computed (the others weigh 0 at every step).
    scored = exit_recipe.parse_exit_layers(config.exit_layers, cfg.num_layers)

    def loss_fn(params, batch, weights_L, key):
        keep = exit_recipe.layer_keep_mask(key, rates_L, batch.shape[0]) if use_dropout else None
        terms = exit_recipe.exit_losses(params, cfg, batch, config.exit_stride,
                                        config.distill_temperature, keep, scored)
        return exit_recipe.combine_losses(terms, weights_L, config.distill_weight), terms

    @functools.partial(jax.jit, donate_argnums=(0,))
    def train_step(state: TrainState, batch, lr, weights_L, key_data):
        key = jax.random.wrap_key_data(key_data)
        (loss, terms), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, batch, weights_L, key)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = jax.tree.map(lambda p, u: p + (lr * u).astype(p.dtype), state.params, updates)
        metrics = {"loss": loss, "ce_exits": terms["ce"], "kl_exits": terms["kl"],
                   "agreement_exits": terms["agreement"], "grad_norm": optax.tree.norm(grads)}
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


# ----- evaluation ----------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("cfg",))
def _eval_batch(params: Params, cfg: ModelConfig, batch_BxT1: jax.Array,
                weight_WxBxT: jax.Array):
    """Per-exit sums [W, L] of weight * (NLL, agreement with layer L, correct) over a batch,
    one row per token weighting (e.g. every token, reply tokens only)."""
    inputs, targets = batch_BxT1[:, :-1], batch_BxT1[:, 1:]

    def stats(h_BxTxD, index):
        logits = exit_recipe.shared_head_logits(params, cfg, h_BxTxD)
        target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        nll_BxT = jax.nn.logsumexp(logits, axis=-1) - target_logit
        return jnp.sum(weight_WxBxT * nll_BxT, axis=(1, 2)), jnp.argmax(logits, axis=-1)

    _, (nll_LxW, argmax_LxBxT) = scan_exits(params, cfg, inputs, stats)
    agree_LxBxT = (argmax_LxBxT == argmax_LxBxT[-1]).astype(jnp.float32)
    correct_LxBxT = (argmax_LxBxT == targets).astype(jnp.float32)
    agree_WxL = jnp.einsum("WBT,LBT->WL", weight_WxBxT, agree_LxBxT)
    correct_WxL = jnp.einsum("WBT,LBT->WL", weight_WxBxT, correct_LxBxT)
    return nll_LxW.T, agree_WxL, correct_WxL


def _metrics(nll, agree, correct, tokens) -> dict[str, Any]:
    ce = nll / max(tokens, 1)
    return {"tokens": int(tokens), "perplexity": float(math.exp(ce[-1])),
            "ce_exits": [round(float(x), 4) for x in ce],
            "agreement_exits": [round(float(x), 4) for x in agree / max(tokens, 1)],
            "accuracy_exits": [round(float(x), 4) for x in correct / max(tokens, 1)]}


def evaluate(params: Params, cfg: ModelConfig, batches, reply_masks=None,
             mesh=None) -> dict[str, Any]:
    """Held-out metrics over `batches` ([B, T+1] arrays), per exit e = 1..L.

    Returns {"tokens", "perplexity" (final layer), "ce_exits" [L], "agreement_exits" [L]
    (top-1 agreement of exit e with the final layer: the greedy acceptance rate),
    "accuracy_exits" [L] (top-1 next-token accuracy)} over every target token. With
    `reply_masks` ([B, T+1] 0/1 arrays aligned with `batches`, 1 on assistant-reply tokens),
    the same metrics over the target tokens inside replies are under "replies". On a
    `mesh`, the batches split over "data".
    """
    L = cfg.num_layers
    W = 1 if reply_masks is None else 2
    nll, agree, correct, tokens = np.zeros((W, L)), np.zeros((W, L)), np.zeros((W, L)), np.zeros(W)
    masks = iter(reply_masks) if reply_masks is not None else None
    for batch in batches:
        weights = [np.ones((batch.shape[0], batch.shape[1] - 1), np.float32)]
        if masks is not None:
            weights.append(np.asarray(next(masks))[:, 1:].astype(np.float32))
        weights = np.stack(weights)
        # the weights [W, B, T] split over "data" by their batch axis
        placed_batch = mesh_lib.place_batch(np.asarray(batch), mesh)
        placed_weights = (jax.device_put(weights) if mesh is None else sharding.shard_arrays(
            weights, sharding.named_sharding((None, "batch"), weights.shape, mesh)))
        n, a, c = sharding.host_values(_eval_batch(params, cfg, placed_batch, placed_weights))
        nll, agree, correct = nll + n, agree + a, correct + c
        tokens += weights.sum(axis=(1, 2))
    out = _metrics(nll[0], agree[0], correct[0], tokens[0])
    if W == 2:
        out["replies"] = _metrics(nll[1], agree[1], correct[1], tokens[1])
    return out


# ----- data ----------------------------------------------------------------------------

# "mixed": the ShareGPT training split plus the init_from model's continuations, each repeated
# `data.on_policy_repeat` times per epoch: the final layer keeps learning human text while
# the exits also see the text they will draft in decoding.
DATA_SOURCES = ("sharegpt", "on_policy", "mixed")


def validate_data(config: ml_collections.ConfigDict) -> None:
    """ValueError naming the `data` key with a bad value (before any data is read)."""
    d = config.data
    if d.source not in DATA_SOURCES:
        raise ValueError(f"data.source={d.source!r} must be one of {DATA_SOURCES}")
    if d.source in ("on_policy", "mixed"):
        if not config.init_from:
            raise ValueError(f"data.source={d.source!r} trains on the init_from model's own "
                             "continuations: set init_from (a model directory)")
        try:
            on_policy.generation_from_config(d, config.seed)
        except ValueError as e:
            raise ValueError(f"data.{e} with data.source={d.source!r}") from None
    if d.source == "mixed" and (not isinstance(d.on_policy_repeat, int)
                                or d.on_policy_repeat < 1):
        raise ValueError(f"data.on_policy_repeat={d.on_policy_repeat!r} must be an integer "
                         ">= 1 with data.source='mixed'")


def prepare_data(config: ml_collections.ConfigDict, work_dir: Path, tokenizer=None,
                 init_model: Model | None = None):
    """(tokenizer, train PackedBatches, eval PackedBatches, eval reply-mask PackedBatches).

    Training documents: the ShareGPT training split (`data.source="sharegpt"`), the
    `init_from` model's own continuations of ShareGPT training prompts
    (`data.source="on_policy"`, `on_policy.config_docs`, cached beside the token ids), or
    both (`"mixed"`: the split, then the continuations `data.on_policy_repeat` times; the
    packing shuffles them together); evaluation is the ShareGPT evaluation split always.
    `tokenizer` (e.g. the `init_from` model's) is used as is; None: the one in work_dir
    (resume) or a newly trained one."""
    d = config.data
    sharegpt = datasets.load_sharegpt()
    train_records, eval_records = datasets.split_sharegpt(sharegpt.records)
    train_texts = [t for t in map(datasets.conversation_text, train_records) if t]
    eval_records = [r for r in eval_records if datasets.conversation_text(r)]
    if d.max_train_docs:
        train_texts = train_texts[:d.max_train_docs]
    if d.max_eval_docs:
        eval_records = eval_records[:d.max_eval_docs]
    eval_texts = [datasets.conversation_text(r) for r in eval_records]

    vocab_size = config.model.vocab_size
    tok_dir = work_dir / "tokenizer"
    if tokenizer is None and config.resume and (tok_dir / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
        if len(tokenizer) != vocab_size:
            tokenizer = None
    if tokenizer is None:
        tokenizer = data.train_tokenizer(train_texts[:d.tokenizer_train_docs], vocab_size,
                                         tok_dir,
                                         model_max_length=config.model.max_position_embeddings)
    if len(tokenizer) > vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens > vocab_size={vocab_size}")
    cache = Path(d.token_cache_dir).expanduser() if d.token_cache_dir else work_dir / "token_cache"
    if d.source == "on_policy":
        _, train_docs = on_policy.config_docs(init_model, d, config.seed, cache)
    else:
        train_docs = data.tokenize_docs(tokenizer, train_texts, cache)
    if d.source == "mixed":
        _, policy_docs = on_policy.config_docs(init_model, d, config.seed, cache)
        train_docs = list(train_docs) + list(policy_docs) * d.on_policy_repeat
    eval_docs = data.tokenize_docs(tokenizer, eval_texts, cache)
    reply_masks = data.reply_token_masks(tokenizer, eval_records)
    if [len(m) for m in reply_masks] != [len(x) for x in eval_docs]:
        raise AssertionError("reply masks are not aligned with the evaluation tokens")
    eos = tokenizer.eos_token_id
    train = data.PackedBatches(train_docs, d.seq_len, d.batch_size, d.seed, eos_id=eos)
    evals = data.PackedBatches(eval_docs, d.seq_len, d.batch_size, d.seed, eos_id=eos,
                               shuffle=False)
    # The same packing over the masks (0 for the </s> separators): row for row aligned.
    eval_masks = data.PackedBatches(reply_masks, d.seq_len, d.batch_size, d.seed, eos_id=0,
                                    shuffle=False)
    return tokenizer, train, evals, eval_masks


def load_init_model(config: ml_collections.ConfigDict, cfg: ModelConfig, mesh=None) -> Model:
    """The `init_from` HF directory as float32 stacked-layer params; ValueError naming the
    fields where its architecture differs from `config.model`."""
    model = load_model(Path(config.init_from).expanduser(), dtype="float32", layer_layout="scan",
                       mesh=mesh)
    differ = [f for f in dataclasses.fields(ModelConfig)
              if getattr(model.cfg, f.name) != getattr(cfg, f.name)]
    if differ:
        raise ValueError("init_from model differs from config.model in " + ", ".join(
            f"{f.name} ({getattr(model.cfg, f.name)!r} vs {getattr(cfg, f.name)!r})"
            for f in differ))
    if model.heads:
        raise ValueError("init_from model has trained exit heads; pretrain trains the shared "
                         "head only")
    return model


# ----- the run -------------------------------------------------------------------------

def initial_state(config: ml_collections.ConfigDict, cfg: ModelConfig,
                  tx: optax.GradientTransformation, params: Params | None, mesh) -> TrainState:
    """The state at step 0: `params` (the init_from model's) or new ones from `config.seed`;
    on a mesh, created shard by shard by the rule table, the optimizer state sharded as the
    parameters (one program, so no device ever holds a whole array)."""
    def make(params):
        if params is None:
            params = init_params(cfg, jax.random.key(config.seed), init_std=config.init_std)
        return TrainState(step=jnp.zeros((), jnp.int32), elapsed_s=jnp.zeros((), jnp.float32),
                          params=params, opt_state=tx.init(params))

    if mesh is None:
        return make(params)
    if params is None:
        shapes = jax.eval_shape(lambda: make(None).params)
        shardings = sharding.param_shardings(cfg, shapes, mesh)
        params = jax.jit(lambda: make(None).params, out_shardings=shardings)()
    return jax.jit(make)(params)


def _replicated(mesh, *values):
    """Host scalars and small arrays replicated on the mesh (as they are on one device)."""
    if mesh is None:
        return values
    return sharding.shard_arrays(values, sharding.replicated(values, mesh))


def resolve_dirs(config: ml_collections.ConfigDict) -> tuple[Path, Path]:
    """(out_dir, work_dir) with `~` expanded; out_dir "" means the package's default_model."""
    out = Path(config.out_dir).expanduser() if config.out_dir else PACKAGE_DEFAULT_MODEL_DIR
    return out, Path(config.work_dir).expanduser()


def pretrain(config: ml_collections.ConfigDict, progress: bool = True,
             mesh=None) -> dict[str, Any]:
    """Trains, evaluates and saves a model per `config` (configs/pretrain_default.py).

    `mesh`: a device mesh ("data", "model") to train over (module docstring); None: the
    mesh set by `jax.set_mesh`, if any, else one device. A checkpoint written on one mesh
    resumes on any other. Returns the training summary (also written to
    `out_dir/training_summary.json`).
    """
    if mesh is None and not jax.sharding.get_mesh().empty:
        mesh = jax.sharding.get_mesh()
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        return _pretrain(config, progress, mesh)


def _pretrain(config: ml_collections.ConfigDict, progress: bool, mesh) -> dict[str, Any]:
    from tqdm import tqdm

    out_dir, work_dir = resolve_dirs(config)
    work_dir.mkdir(parents=True, exist_ok=True)
    cfg = model_config_from_ml_collections(config.model)

    if not isinstance(config.num_steps, int) or config.num_steps < 0:
        raise ValueError(f"num_steps must be an integer >= 0 (0: evaluate only), got "
                         f"{config.num_steps!r}")
    exit_recipe.validate_recipe(config, cfg.num_layers)
    validate_data(config)
    mesh_lib.check_batch(config.data.batch_size, mesh)
    init_model = load_init_model(config, cfg, mesh) if config.init_from else None

    t0 = time.time()
    tokenizer, train_batches, eval_batches, eval_masks = prepare_data(
        config, work_dir, init_model.tokenizer if init_model is not None else None, init_model)
    data_seconds = time.time() - t0

    params = init_model.params if init_model is not None else None
    tx = make_optimizer(config.optim, params if params is not None
                        else jax.eval_shape(lambda: init_params(cfg, jax.random.key(0))))
    state = initial_state(config, cfg, tx, params, mesh)
    ckpt_dir = work_dir / CHECKPOINT_SUBDIR
    if not config.resume and ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)
    ckpt = Checkpointer(ckpt_dir, max_to_keep=1, async_save=False)
    if config.resume and ckpt.latest_step() is not None:
        # read straight into this run's shardings, whatever mesh wrote the checkpoint
        state, _ = ckpt.restore(ckpt.latest_step(), abstract_like(state))
        log.warning("resuming from %s at step %d", ckpt_dir, int(state.step))
    step_now, elapsed_now = sharding.host_values((state.step, state.elapsed_s))
    start_step, start_elapsed = int(step_now), float(elapsed_now)
    # Training takes the backend's fast default matmul passes (TF32 / bfloat16 on GPUs and
    # TPUs); the exact "highest" precision is what decoding needs (ModelConfig).
    train_step = make_train_step(cfg.replace(matmul_precision="default"), tx, config)
    dropout_key = jax.random.key(config.seed + 1)

    log_path = work_dir / "metrics.jsonl"
    tokens_per_step = config.data.batch_size * config.data.seq_len
    history, pending = [], None
    t_start = time.time()
    t_window, tokens_window = t_start, 0
    bar = tqdm(total=config.num_steps, initial=start_step, disable=not progress,
               dynamic_ncols=True, desc="pretrain")

    def elapsed() -> float:
        return start_elapsed + time.time() - t_start

    def flush(pending):
        # Metrics are fetched one step late, so the host never blocks dispatch.
        step, lr, metrics = pending
        m = sharding.host_values(metrics)
        return {"step": step, "loss": float(m["loss"]), "ce_final": float(m["ce_exits"][-1]),
                "ce_exits": [round(float(x), 4) for x in m["ce_exits"]],
                "kl_exits": [round(float(x), 4) for x in m["kl_exits"]],
                "agreement_exits": [round(float(x), 4) for x in m["agreement_exits"]],
                "grad_norm": float(m["grad_norm"]), "lr": lr}

    def save_state():
        done = int(sharding.host_values(state.step))
        if done == ckpt.latest_step():  # saved at this step already (the last periodic save)
            return
        ckpt.save(done, state.replace(elapsed_s=_replicated(mesh, np.asarray(elapsed(),
                                                                             np.float32))[0]),
                  {"step": done})

    steps_done = start_step
    leader = mesh_lib.is_leader()  # process 0 writes the run's files
    with open(log_path, "a") if leader else contextlib.nullcontext() as log_file:
        for step, batch in train_batches.batches_from(start_step, config.num_steps - start_step):
            if training_progress(config, step, elapsed()) >= 1.0:
                log.warning("time budget %.0f s used up at step %d", config.time_budget_s, step)
                break
            progress_now = training_progress(config, step, elapsed())
            lr = learning_rate(config.optim, step, progress_now)
            weights_L = exit_recipe.step_exit_weights(config, cfg.num_layers, step, progress_now)
            state, metrics = train_step(state, mesh_lib.place_batch(np.asarray(batch), mesh),
                                        *_replicated(mesh, np.float32(lr),
                                                     np.asarray(weights_L, np.float32),
                                                     jax.random.key_data(jax.random.fold_in(
                                                         dropout_key, step))))
            if pending is not None:
                rec = flush(pending)
                if (rec["step"] + 1) % config.log_every == 0 or rec["step"] == start_step:
                    now = time.time()
                    rec["tokens_per_second"] = tokens_window / max(now - t_window, 1e-9)
                    rec["elapsed_s"] = elapsed()
                    t_window, tokens_window = now, 0
                    history.append(rec)
                    if leader:
                        log_file.write(json.dumps(rec) + "\n")
                        log_file.flush()
                    bar.set_postfix(loss=f"{rec['loss']:.3f}", ce=f"{rec['ce_final']:.3f}",
                                    tok_s=f"{rec['tokens_per_second']:.0f}", lr=f"{lr:.1e}")
            pending = (step, lr, metrics)
            tokens_window += tokens_per_step
            steps_done = step + 1
            bar.update(1)
            if config.checkpoint_every and steps_done % config.checkpoint_every == 0:
                save_state()
            if config.time_limit_s and time.time() - t_start > config.time_limit_s:
                log.warning("time limit %.0f s reached at step %d", config.time_limit_s,
                            steps_done)
                break
        if pending is not None:
            rec = flush(pending)
            rec["elapsed_s"] = elapsed()
            history.append(rec)
            if leader:
                log_file.write(json.dumps(rec) + "\n")
    bar.close()
    train_seconds = time.time() - t_start
    if config.checkpoint_every:
        save_state()
    ckpt.close()

    n_eval = min(config.eval_batches, eval_batches.batches_per_epoch)
    metrics = evaluate(state.params, cfg, (eval_batches.batch(i) for i in range(n_eval)),
                       (eval_masks.batch(i) for i in range(n_eval)), mesh)

    save_model_dir(out_dir, cfg, state.params, tokenizer, config.save_dtype)
    summary = {
        "steps": steps_done, "steps_this_run": steps_done - start_step,
        "train_seconds_total": round(elapsed(), 1),
        "train_seconds_this_run": round(train_seconds, 1), "data_seconds": round(data_seconds, 1),
        "tokens_per_step": tokens_per_step, "tokens_seen": steps_done * tokens_per_step,
        "tokens_per_second": round((steps_done - start_step) * tokens_per_step
                                   / max(train_seconds, 1e-9), 1),
        "first_loss": history[0]["loss"] if history else None,
        "last_loss": history[-1]["loss"] if history else None,
        "train_source": config.data.source,
        "train_docs": len(train_batches.docs), "train_tokens_per_epoch": train_batches.num_tokens,
        "eval": metrics,
        "exit_loss_weights": [round(float(w), 4) for w in exit_recipe.exit_loss_weights(
            cfg.num_layers, config.exit_loss_scale, config.exit_weights,
            exit_recipe.parse_exit_layers(config.exit_layers, cfg.num_layers))],
        "num_params": int(sum(x.size for x in jax.tree.leaves(state.params))),
        "config": config.to_dict(),
    }
    if leader:
        (out_dir / SUMMARY_FILENAME).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def save_model_dir(out_dir: Path, cfg: ModelConfig, params: Params, tokenizer,
                   save_dtype: str) -> None:
    """HF directory: weights stored as `save_dtype`, config.json keeping `cfg.dtype` (float32
    by default, so both hispec and transformers load the bfloat16 file as float32)."""
    stored = jax.tree.map(lambda p: np.asarray(p).astype(jnp.dtype(save_dtype)),
                          sharding.host_values(params))  # gathered from every process
    if not mesh_lib.is_leader():
        return
    generation_config = {"bos_token_id": tokenizer.bos_token_id,
                         "eos_token_id": tokenizer.eos_token_id}
    save_model(Model(cfg=cfg, params=stored, tokenizer=tokenizer,
                     generation_config=generation_config), out_dir)
    for f in Path(out_dir).iterdir():  # safetensors writes 0600; a shipped model is world-readable
        if f.is_file():
            f.chmod(0o644)


def load_pretrain_config(path: str | Path, small: bool = False) -> ml_collections.ConfigDict:
    """Runs a pretrain config file's `get_config()` (`get_config("small")` when `small`)."""
    from hispec_jax.models.presets import run_config_file

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"pretrain config {str(path)!r} is not a file")
    return run_config_file(path, "small") if small else run_config_file(path)
