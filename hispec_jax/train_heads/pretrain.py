"""Pretraining an early-exit model from scratch with a LayerSkip-style early-exit loss.

The shared exit head (the model's final norm + LM head) is supervised at every layer's
output, so every exit `e` can draft. The loss, in float32, with per-layer cross entropies
`CE_e` of the shared head applied to the layer-`e` states:

    loss = CE_L + exit_loss_scale * sum_{e=1}^{L-1} w_e CE_e,   w_e = e / sum_{e'<L} e'

Early-exit weights grow linearly with depth (deeper exits are asked for more, as in
LayerSkip's depth-increasing scale, without its curriculum), sum to `exit_loss_scale`, and
every one of them is smaller than the final layer's weight 1, so the full model stays
the main objective.

Pipeline (`pretrain`): ShareGPT training split -> byte-level BPE tokenizer -> cached token
ids -> `PackedBatches` -> jitted AdamW steps (clip_by_global_norm; linear warmup, then a
cosine over training progress: steps / num_steps, or elapsed / time_budget_s when a
wall-clock budget is set and that is further along)
-> held-out evaluation (perplexity, per-exit top-1 agreement with the final layer) -> a HF
directory (`save_model` + tokenizer + generation_config.json). The training state is
snapshotted to `work_dir/state.msgpack` so an interrupted run resumes at the same batch.

Shapes: B batch, T sequence length, D hidden, V vocab, L layers.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

import flax.serialization
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.model import Model, save_model
from hispec_jax.models.params import Params, init_params
from hispec_jax.models.presets import model_config_from_ml_collections
from hispec_jax.models.transformer import embed, run_layers
from hispec_jax.train_heads import data

log = logging.getLogger(__name__)

STATE_FILENAME = "state.msgpack"
SUMMARY_FILENAME = "training_summary.json"
PACKAGE_DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[1] / "default_model"


# ----- loss ----------------------------------------------------------------------------

def exit_loss_weights(num_layers: int, exit_loss_scale: float) -> np.ndarray:
    """Per-exit loss weights [L]: w_e ∝ e for e < L summing to `exit_loss_scale`; w_L = 1."""
    e = np.arange(1, num_layers, dtype=np.float64)
    early = exit_loss_scale * e / e.sum() if num_layers > 1 else e
    return np.concatenate([early, [1.0]]).astype(np.float32)


def scan_exits(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array,
               per_exit: Callable[[jax.Array, jax.Array], Any]):
    """Runs every layer over a block (no context), applying `per_exit` to each layer's output.

    Each scan step is the library's `run_layers` for one layer with an empty (capacity 0)
    KV cache and positions 0..T-1, so the block attends to itself causally: the exact
    per-layer math the decoders use. `per_exit(h_BxTxD, layer_index)` gets the 0-based
    layer index (a traced scalar). Returns (layer-L states [B, T, D], `per_exit` outputs
    stacked on a leading [L] axis).
    """
    B, T = tokens_BxT.shape
    positions_BxT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    no_context = KVCache.zeros(cfg, B, 0, num_layers=1)

    def step(x_BxTxD, xs):
        layer_params, index = xs
        one_layer = {"layers": jax.tree.map(lambda w: w[None], layer_params)}
        x_BxTxD, _ = run_layers(one_layer, cfg, x_BxTxD, positions_BxT, no_context, 0, 1)
        return x_BxTxD, per_exit(x_BxTxD, index)

    return jax.lax.scan(step, embed(params, tokens_BxT),
                        (params["layers"], jnp.arange(cfg.num_layers)))


def _shared_head_logits(params: Params, cfg: ModelConfig, h_BxTxD: jax.Array) -> jax.Array:
    # Exit L always uses the shared head (final norm + LM head), whatever the states' depth.
    return exit_logits(params, {}, cfg, h_BxTxD, cfg.num_layers)


def _mean_ce(logits_BxTxV: jax.Array, targets_BxT: jax.Array) -> jax.Array:
    target_logit = jnp.take_along_axis(logits_BxTxV, targets_BxT[..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits_BxTxV, axis=-1) - target_logit)


def exit_cross_entropies(params: Params, cfg: ModelConfig, batch_BxT1: jax.Array,
                         exit_stride: int = 1) -> jax.Array:
    """Mean next-token cross entropy [L] of the shared head at every exit (float32).

    The final layer's is over every position. With `exit_stride` s > 1 an early exit e is
    scored on the positions t ≡ e (mod s) only: an unbiased estimate at 1/s of the head
    cost (the exit heads are a third of the training FLOPs at s = 1 for the default model).
    """
    inputs, targets = batch_BxT1[:, :-1], batch_BxT1[:, 1:]
    T = inputs.shape[1]
    n = T // exit_stride

    def ce(h_BxTxD, index):
        if exit_stride == 1:
            return _mean_ce(_shared_head_logits(params, cfg, h_BxTxD), targets)
        t = jnp.arange(n) * exit_stride + index % exit_stride
        logits = _shared_head_logits(params, cfg, jnp.take(h_BxTxD, t, axis=1))
        return _mean_ce(logits, jnp.take(targets, t, axis=1))

    h_BxTxD, ce_L = scan_exits(params, cfg, inputs, ce)
    if exit_stride == 1:
        return ce_L
    final = _mean_ce(_shared_head_logits(params, cfg, h_BxTxD), targets)
    return ce_L.at[-1].set(final)


# ----- optimizer and train step --------------------------------------------------------

@flax.struct.dataclass
class TrainState:
    """step: [] int32; elapsed_s: [] float32 training seconds so far (all runs); params;
    opt_state: the optax state."""

    step: jax.Array
    elapsed_s: jax.Array
    params: Params
    opt_state: Any


def make_optimizer(optim: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """chain(clip_by_global_norm, AdamW at learning rate 1); no weight decay on norms.

    The learning rate multiplies the updates in the train step (`learning_rate`), so the
    schedule can follow wall-clock progress under a time budget.
    """
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    return optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adamw(1.0, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay,
                    mask=decay_mask))


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


def make_train_step(cfg: ModelConfig, tx: optax.GradientTransformation, weights_L: np.ndarray,
                    exit_stride: int = 1):
    """A jitted `(state, batch [B, T+1], lr) -> (state, metrics)`; the state is donated."""
    weights_L = jnp.asarray(weights_L)

    def loss_fn(params, batch):
        ce_L = exit_cross_entropies(params, cfg, batch, exit_stride)
        return jnp.sum(weights_L * ce_L), ce_L

    @functools.partial(jax.jit, donate_argnums=(0,))
    def train_step(state: TrainState, batch, lr):
        (loss, ce_L), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = jax.tree.map(lambda p, u: p + (lr * u).astype(p.dtype), state.params, updates)
        metrics = {"loss": loss, "ce_exits": ce_L, "grad_norm": optax.tree.norm(grads)}
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


# ----- evaluation ----------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("cfg",))
def _eval_batch(params: Params, cfg: ModelConfig, batch_BxT1: jax.Array):
    inputs, targets = batch_BxT1[:, :-1], batch_BxT1[:, 1:]

    def stats(h_BxTxD, index):
        logits = _shared_head_logits(params, cfg, h_BxTxD)
        target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        nll = jnp.sum(jax.nn.logsumexp(logits, axis=-1) - target_logit)
        return nll, jnp.argmax(logits, axis=-1)

    _, (nll_L, argmax_LxBxT) = scan_exits(params, cfg, inputs, stats)
    agree_L = jnp.sum(argmax_LxBxT == argmax_LxBxT[-1], axis=(1, 2))
    correct_L = jnp.sum(argmax_LxBxT == targets, axis=(1, 2))
    return nll_L, agree_L, correct_L


def evaluate(params: Params, cfg: ModelConfig, batches) -> dict[str, Any]:
    """Held-out metrics over `batches` ([B, T+1] arrays), per exit e = 1..L.

    Returns {"tokens", "perplexity" (final layer), "ce_exits" [L], "agreement_exits" [L]
    (top-1 agreement of exit e with the final layer: the greedy acceptance rate),
    "accuracy_exits" [L] (top-1 next-token accuracy)}.
    """
    L = cfg.num_layers
    nll, agree, correct, tokens = np.zeros(L), np.zeros(L), np.zeros(L), 0
    for batch in batches:
        n, a, c = jax.device_get(_eval_batch(params, cfg, jnp.asarray(batch)))
        nll, agree, correct = nll + n, agree + a, correct + c
        tokens += batch.shape[0] * (batch.shape[1] - 1)
    ce = nll / max(tokens, 1)
    return {"tokens": int(tokens), "perplexity": float(math.exp(ce[-1])),
            "ce_exits": [round(float(x), 4) for x in ce],
            "agreement_exits": [round(float(x), 4) for x in agree / max(tokens, 1)],
            "accuracy_exits": [round(float(x), 4) for x in correct / max(tokens, 1)]}


# ----- data ----------------------------------------------------------------------------

def prepare_data(config: ml_collections.ConfigDict, work_dir: Path):
    """(tokenizer, train PackedBatches, eval PackedBatches) for the ShareGPT split."""
    d = config.data
    sharegpt = data.load_sharegpt()
    train_records, eval_records = data.split_sharegpt(sharegpt.records)
    train_texts = [t for t in map(data.conversation_text, train_records) if t]
    eval_texts = [t for t in map(data.conversation_text, eval_records) if t]
    if d.max_train_docs:
        train_texts = train_texts[:d.max_train_docs]
    if d.max_eval_docs:
        eval_texts = eval_texts[:d.max_eval_docs]

    vocab_size = config.model.vocab_size
    tok_dir = work_dir / "tokenizer"
    tokenizer = None
    if config.resume and (tok_dir / "tokenizer.json").exists():
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
    cache = work_dir / "token_cache"
    train_docs = data.tokenize_docs(tokenizer, train_texts, cache)
    eval_docs = data.tokenize_docs(tokenizer, eval_texts, cache)
    eos = tokenizer.eos_token_id
    train = data.PackedBatches(train_docs, d.seq_len, d.batch_size, d.seed, eos_id=eos)
    evals = data.PackedBatches(eval_docs, d.seq_len, d.batch_size, d.seed, eos_id=eos,
                               shuffle=False)
    return tokenizer, train, evals


# ----- the run -------------------------------------------------------------------------

def _save_state(state: TrainState, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(flax.serialization.to_bytes(jax.device_get(state)))
    os.replace(tmp, path)


def resolve_dirs(config: ml_collections.ConfigDict) -> tuple[Path, Path]:
    """(out_dir, work_dir) with `~` expanded; out_dir "" means the package's default_model."""
    out = Path(config.out_dir).expanduser() if config.out_dir else PACKAGE_DEFAULT_MODEL_DIR
    return out, Path(config.work_dir).expanduser()


def pretrain(config: ml_collections.ConfigDict, progress: bool = True) -> dict[str, Any]:
    """Trains, evaluates and saves a model per `config` (configs/pretrain_default.py).

    Returns the training summary (also written to `out_dir/training_summary.json`).
    """
    from tqdm import tqdm

    out_dir, work_dir = resolve_dirs(config)
    work_dir.mkdir(parents=True, exist_ok=True)
    cfg = model_config_from_ml_collections(config.model)

    t0 = time.time()
    tokenizer, train_batches, eval_batches = prepare_data(config, work_dir)
    data_seconds = time.time() - t0

    tx = make_optimizer(config.optim)
    weights_L = exit_loss_weights(cfg.num_layers, config.exit_loss_scale)
    params = init_params(cfg, jax.random.key(config.seed), init_std=config.init_std)
    state = TrainState(step=jnp.zeros((), jnp.int32), elapsed_s=jnp.zeros((), jnp.float32),
                       params=params, opt_state=tx.init(params))
    state_path = work_dir / STATE_FILENAME
    if config.resume and state_path.exists():
        state = flax.serialization.from_bytes(state, state_path.read_bytes())
        state = jax.tree.map(jnp.asarray, state)
        log.warning("resuming from %s at step %d", state_path, int(state.step))
    start_step, start_elapsed = int(state.step), float(state.elapsed_s)
    train_step = make_train_step(cfg, tx, weights_L, config.exit_stride)

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
        m = jax.device_get(metrics)
        return {"step": step, "loss": float(m["loss"]), "ce_final": float(m["ce_exits"][-1]),
                "ce_exits": [round(float(x), 4) for x in m["ce_exits"]],
                "grad_norm": float(m["grad_norm"]), "lr": lr}

    def save_state():
        _save_state(state.replace(elapsed_s=jnp.float32(elapsed())), state_path)

    steps_done = start_step
    with open(log_path, "a") as log_file:
        for step, batch in train_batches.batches_from(start_step, config.num_steps - start_step):
            if training_progress(config, step, elapsed()) >= 1.0:
                log.warning("time budget %.0f s used up at step %d", config.time_budget_s, step)
                break
            lr = learning_rate(config.optim, step, training_progress(config, step, elapsed()))
            state, metrics = train_step(state, jnp.asarray(batch), jnp.float32(lr))
            if pending is not None:
                rec = flush(pending)
                if (rec["step"] + 1) % config.log_every == 0 or rec["step"] == start_step:
                    now = time.time()
                    rec["tokens_per_second"] = tokens_window / max(now - t_window, 1e-9)
                    rec["elapsed_s"] = elapsed()
                    t_window, tokens_window = now, 0
                    history.append(rec)
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
            log_file.write(json.dumps(rec) + "\n")
    bar.close()
    train_seconds = time.time() - t_start
    if config.checkpoint_every:
        save_state()

    n_eval = min(config.eval_batches, eval_batches.batches_per_epoch)
    metrics = evaluate(state.params, cfg, (eval_batches.batch(i) for i in range(n_eval)))

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
        "train_docs": len(train_batches.docs), "train_tokens_per_epoch": train_batches.num_tokens,
        "eval": metrics, "exit_loss_weights": [round(float(w), 4) for w in weights_L],
        "num_params": int(sum(x.size for x in jax.tree.leaves(state.params))),
        "config": config.to_dict(),
    }
    (out_dir / SUMMARY_FILENAME).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def save_model_dir(out_dir: Path, cfg: ModelConfig, params: Params, tokenizer,
                   save_dtype: str) -> None:
    """HF directory: weights stored as `save_dtype`, config.json keeping `cfg.dtype` (float32
    by default, so both hispec and transformers load the bfloat16 file as float32)."""
    stored = jax.tree.map(lambda p: np.asarray(jax.device_get(p)).astype(jnp.dtype(save_dtype)),
                          params)
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
