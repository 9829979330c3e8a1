"""The optimizer and the jitted train / eval steps of exit-head distillation.

Only the heads are optimized: the optimizer is built over the heads pytree alone, and the
frozen base parameters enter the steps as a plain (non-differentiated) argument, so no
update can reach them.

    optimizer = chain(clip_by_global_norm(c), adamw(warmup_cosine(lr, warmup, total), mask))

The weight-decay mask comes from parameter paths: projections decay, RMSNorm scales
(`norm`, an adapter's `adapter_norm`) do not. Heads that use the model's own final norm +
LM head (adapters with `projection="shared"`) read them from `shared`
(`heads.shared_head_params`), a frozen input like the base parameters.

Train state (a plain dict, so orbax saves it as is):

    step       int32 []       completed steps (the next batch index)
    heads      ExitHeads      float32 master copy
    opt_state  optax state    over `heads`
    rng        uint32 [2]     key data of the run's RNG stream, split every step (the
                              distillation loss itself is deterministic; the stream is kept
                              and checkpointed so stochastic additions resume exactly)

Shapes: B batch, E head layers, T tokens, D hidden, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.params import ExitHeads, Params
from hispec_jax.train_heads import losses
from hispec_jax.train_heads.features import Features, compute_features

TrainState = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """Hyperparameters of `make_optimizer` (hashable: one optimizer object per setting)."""

    learning_rate: float
    warmup_steps: int
    total_steps: int
    end_lr_fraction: float = 0.0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    clip_norm: float = 1.0


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """Static settings of the train / eval steps."""

    cfg: ModelConfig
    head_layers: tuple[int, ...]
    temperature: float
    top_k: int  # target top-k (0: full vocabulary)
    loss: str = "kl"  # "kl": T²·KL(final ‖ exit); "ce": cross-entropy on the final layer's top-1


def learning_rate_schedule(s: OptimizerSettings) -> optax.Schedule:
    """Linear warmup from 0 to `learning_rate`, then cosine decay to `end_lr_fraction` of it."""
    if not 0 <= s.warmup_steps < s.total_steps:
        raise ValueError(f"warmup_steps={s.warmup_steps} must be < total_steps={s.total_steps}")
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=s.learning_rate, warmup_steps=s.warmup_steps,
        decay_steps=s.total_steps, end_value=s.learning_rate * s.end_lr_fraction)


def decay_mask(heads: ExitHeads) -> ExitHeads:
    """True for the projection matrices, False for the norm scales (by parameter path)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: not jax.tree_util.keystr(path[-1:]).endswith("norm']"), heads)


@functools.lru_cache(maxsize=None)
def make_optimizer(s: OptimizerSettings) -> optax.GradientTransformation:
    """`chain(clip_by_global_norm, adamw)` with the warmup-cosine schedule (cached per settings)."""
    return optax.chain(
        optax.clip_by_global_norm(s.clip_norm),
        optax.adamw(learning_rate_schedule(s), b1=s.b1, b2=s.b2, eps=s.eps,
                    weight_decay=s.weight_decay, mask=decay_mask))


def init_state(heads: ExitHeads, optimizer: optax.GradientTransformation, seed: int) -> TrainState:
    return {"step": jnp.zeros((), jnp.int32), "heads": heads, "opt_state": optimizer.init(heads),
            "rng": jax.random.key_data(jax.random.key(seed))}


def _exit_loss(head, hidden_BxTxD, targets, shared, *, settings: StepSettings, exit_layer: int):
    """(loss, top-1 agreement) of one exit; rematerialized so only one exit's [B, T, V]
    logits are alive at a time in the backward pass."""
    logits = exit_logits(shared or {}, {str(exit_layer): head}, settings.cfg,
                         hidden_BxTxD.astype(jnp.float32), exit_layer)
    if settings.loss == "ce":
        loss = losses.hard_loss(targets, logits)
    else:
        loss = losses.distill_loss(targets, logits, settings.temperature)
    return loss, losses.top1_agreement(targets, logits)


def heads_loss(heads: ExitHeads, features: Features, settings: StepSettings, shared=None):
    """Mean over exits of the training loss (T²·KL(final ‖ exit), or the hard
    cross-entropy with `loss="ce"`); aux: per-exit loss ("kl", whichever loss it is) and
    top-1 agreement [E]."""
    kls, agrees = [], []
    for i, e in enumerate(settings.head_layers):
        fn = jax.checkpoint(functools.partial(_exit_loss, settings=settings, exit_layer=e))
        kl, agree = fn(heads[str(e)], features.hidden[:, i], features.targets, shared)
        kls.append(kl)
        agrees.append(agree)
    kl_E, agree_E = jnp.stack(kls), jnp.stack(agrees)
    return jnp.mean(kl_E), {"kl": kl_E, "top1": jax.lax.stop_gradient(agree_E)}


def _update(state: TrainState, features: Features, settings: StepSettings,
            opt: OptimizerSettings, shared=None):
    optimizer = make_optimizer(opt)
    (loss, aux), grads = jax.value_and_grad(heads_loss, has_aux=True)(
        state["heads"], features, settings, shared)
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["heads"])
    heads = optax.apply_updates(state["heads"], updates)
    rng = jax.random.key_data(jax.random.split(jax.random.wrap_key_data(state["rng"]))[0])
    metrics = {"loss": loss, **aux, "grad_norm": optax.tree.norm(grads),
               "lr": learning_rate_schedule(opt)(state["step"])}
    new_state = {"step": state["step"] + 1, "heads": heads, "opt_state": opt_state, "rng": rng}
    return new_state, metrics


@functools.partial(jax.jit, static_argnames=("settings", "opt"))
def train_step_cached(state: TrainState, features: Features, shared: Params | None = None, *,
                      settings: StepSettings, opt: OptimizerSettings):
    """One update from precomputed features (the feature-cache path); `shared`: the frozen
    final norm + LM head, for heads that use them (`heads.shared_head_params`)."""
    return _update(state, features, settings, opt, shared)


@functools.partial(jax.jit, static_argnames=("settings", "opt"))
def train_step_tokens(state: TrainState, params: Params, tokens_BxT: jax.Array, *,
                      settings: StepSettings, opt: OptimizerSettings):
    """One update from token rows: runs the frozen base, then the heads (no cache)."""
    features = compute_features(params, tokens_BxT, cfg=settings.cfg,
                                head_layers=settings.head_layers,
                                temperature=settings.temperature, top_k=settings.top_k)
    return _update(state, features, settings, opt, params)


@functools.partial(jax.jit, static_argnames=("settings",))
def eval_step(heads: ExitHeads, params: Params, tokens_BxT: jax.Array, valid_B: jax.Array, *,
              settings: StepSettings):
    """Held-out sums over valid rows' tokens: {"kl": [E] (exact, full vocabulary, ×T²),
    "top1": [E] greedy agreements, "tokens": []}."""
    features = compute_features(params, tokens_BxT, cfg=settings.cfg,
                                head_layers=settings.head_layers,
                                temperature=settings.temperature, top_k=0)
    T = tokens_BxT.shape[1]
    mask_BxT = jnp.broadcast_to(valid_B[:, None], (valid_B.shape[0], T)).astype(jnp.float32)
    kls, agrees = [], []
    for i, e in enumerate(settings.head_layers):
        logits = exit_logits(params, heads, settings.cfg,
                             features.hidden[:, i].astype(jnp.float32), e)
        kl = losses.kl_per_token(features.targets, logits, settings.temperature)
        agree = jnp.argmax(logits, -1).astype(jnp.int32) == features.targets.top1
        kls.append(settings.temperature**2 * jnp.sum(kl * mask_BxT))
        agrees.append(jnp.sum(agree * mask_BxT))
    return {"kl": jnp.stack(kls), "top1": jnp.stack(agrees), "tokens": jnp.sum(mask_BxT)}
