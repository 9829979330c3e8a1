"""The early-exit training recipe of `hispec pretrain`: exit weights, curriculum, layer
dropout, and the per-exit losses (cross entropy on labels and distillation from the final
layer).

The shared exit head (the model's final norm + LM head) is applied to every layer's output.
With per-exit cross entropies `CE_e`, distillation terms
`KL_e = T² · KL(softmax(z_L / T) ‖ softmax(z_e / T))` (the final layer's logits `z_L` are
a fixed target: no gradient flows into the teacher) and the active set `A(step)` of early
exits chosen by the curriculum, the loss of a step is

    loss = CE_L + sum_{e in A, e < L} w_e(step) [(1 - alpha) CE_e + alpha KL_e]

    w_e(step) = exit_loss_scale * s_e / sum_{e' in A, e' < L} s_{e'}

with `alpha = distill_weight`. The scheme `s_e` (`exit_weights`) is

    "linear"    s_e = e       deeper exits weigh more (stage 1 of the default model; shallow
                              ones starve: exit 1 of 24 gets 1/276 of the early-exit weight)
    "uniform"   s_e = 1       every supervised exit weighs the same
    "sqrt"      s_e = sqrt(e) in between

and `exit_layers` ("" = every early exit, or e.g. "3,6,12") restricts which exits are
supervised at all, so the loss can concentrate on the exits the decoders draft from.

Curricula (LayerSkip §4.1; `curriculum`, `curriculum_rotation` R):

    "none"        every supervised exit at every step
    "rotational"  exit e is active at step s iff e mod R == s mod R   (LayerSkip C_rot,R)
    "gradual"     exits are switched on from the deepest to the shallowest, one more every
                  1 / (2L) of training progress, so all are on after half of training
                  (LayerSkip C_grad)

The active exits' weights are renormalized to sum to `exit_loss_scale` (as LayerSkip's
normalized scale), so a curriculum changes where the early-exit weight goes, not how much
there is. Here the curriculum does not save compute (every exit's states are computed
anyway, whereas LayerSkip uses it to save the LM head at every layer); it is compared for
its effect on the exits.

Layer dropout (LayerSkip §4.1; `layer_dropout_max` p_max): during training, layer l
(0-based) of each sequence is skipped (its output is its input) with probability
`p_l = p_max * (exp(l ln 2 / (L - 1)) - 1)`: 0 for the first layer, p_max for the last, so
the deep layers learn to work on states the shallow ones produce, and the shallow ones to
carry more of the prediction. No rescaling (as in LayerSkip). Constant over training.

Early exits are scored on every `exit_stride`-th position (exit e, 0-based layer index
l = e - 1: positions t ≡ l (mod stride)), an unbiased estimate at a fraction of the LM
head cost; the final layer is scored on every position.

Shapes: B batch, T positions, n = T // stride positions per exit, D hidden, V vocab,
L layers.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.params import Params
from hispec_jax.models.transformer import scan_exits
from hispec_jax.train_heads.losses import Targets, kl_per_token

EXIT_WEIGHT_SCHEMES = ("linear", "uniform", "sqrt")
CURRICULA = ("none", "rotational", "gradual")


# ----- weights and curriculum (host side, numpy) ---------------------------------------

def parse_exit_layers(text: str, num_layers: int) -> tuple[int, ...]:
    """`"3,6,12"` -> (3, 6, 12); `""` -> every early exit 1..L-1. ValueError when out of range."""
    if not str(text).strip():
        return tuple(range(1, num_layers))
    exits = tuple(sorted({int(x) for x in str(text).split(",") if x.strip()}))
    bad = [e for e in exits if not 1 <= e < num_layers]
    if bad:
        raise ValueError(f"exit_layers {bad} are not early exits of a {num_layers}-layer model "
                         f"(1..{num_layers - 1})")
    return exits


def exit_loss_weights(num_layers: int, exit_loss_scale: float, scheme: str = "linear",
                      exit_layers: tuple[int, ...] | None = None,
                      active: np.ndarray | None = None) -> np.ndarray:
    """Per-exit loss weights [L]: w_L = 1, the early exits' per `scheme` (module doc).

    `exit_layers` (1-based; None: all early exits) are the supervised exits, `active` [L]
    bool the curriculum's mask; the weights of the supervised and active early exits sum to
    `exit_loss_scale` (all zero when none is active).
    """
    if scheme not in EXIT_WEIGHT_SCHEMES:
        raise ValueError(f"exit_weights {scheme!r} is not one of {EXIT_WEIGHT_SCHEMES}")
    e = np.arange(1, num_layers + 1, dtype=np.float64)
    s = {"linear": e, "uniform": np.ones_like(e), "sqrt": np.sqrt(e)}[scheme]
    on = np.zeros(num_layers, bool)
    on[[x - 1 for x in (range(1, num_layers) if exit_layers is None else exit_layers)]] = True
    on[-1] = False
    if active is not None:
        on &= np.asarray(active, bool)
    w = np.where(on, s, 0.0)
    if w.sum() > 0:
        w = exit_loss_scale * w / w.sum()
    w[-1] = 1.0
    return w.astype(np.float32)


def curriculum_active(curriculum: str, num_layers: int, step: int, progress: float,
                      rotation: int) -> np.ndarray:
    """[L] bool: which exits the curriculum enables at `step` / training `progress` (the
    final layer always)."""
    e = np.arange(1, num_layers + 1)
    if curriculum == "none":
        active = np.ones(num_layers, bool)
    elif curriculum == "rotational":
        if rotation < 1:
            raise ValueError(f"curriculum_rotation must be >= 1, got {rotation}")
        active = e % rotation == step % rotation
    elif curriculum == "gradual":
        enabled = min(num_layers - 1, int(math.floor(max(progress, 0.0) * 2 * num_layers)))
        active = e >= num_layers - enabled
    else:
        raise ValueError(f"curriculum {curriculum!r} is not one of {CURRICULA}")
    active[-1] = True
    return active


def step_exit_weights(config: ml_collections.ConfigDict, num_layers: int, step: int,
                      progress: float) -> np.ndarray:
    """The [L] loss weights of one training step under `config`'s recipe."""
    active = curriculum_active(config.curriculum, num_layers, step, progress,
                               config.curriculum_rotation)
    return exit_loss_weights(num_layers, config.exit_loss_scale, config.exit_weights,
                             parse_exit_layers(config.exit_layers, num_layers), active)


def layer_dropout_rates(num_layers: int, p_max: float) -> np.ndarray:
    """[L] LayerSkip's per-layer skip probabilities p_max (exp(l ln2 / (L-1)) - 1)."""
    if num_layers == 1:
        return np.zeros(1, np.float32)
    l = np.arange(num_layers, dtype=np.float64)
    return (p_max * (np.exp(l * math.log(2) / (num_layers - 1)) - 1)).astype(np.float32)


def layer_keep_mask(key: jax.Array, rates_L: jax.Array, batch: int) -> jax.Array:
    """[L, B] bool: True where layer l runs for sequence b (drawn with `rates_L`)."""
    return jax.random.uniform(key, (rates_L.shape[0], batch)) >= rates_L[:, None]


# ----- forward over every exit ---------------------------------------------------------

def shared_head_logits(params: Params, cfg: ModelConfig, h: jax.Array) -> jax.Array:
    """Float32 logits of the shared head (final norm + LM head) for states [..., T, D]."""
    lead = h.shape[:-2]
    flat = h.reshape((-1,) + h.shape[-2:])
    logits = exit_logits(params, {}, cfg, flat, cfg.num_layers)
    return logits.reshape(lead + logits.shape[-2:])


def _ce(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-token cross entropy, same leading shape as `targets`."""
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits, axis=-1) - target_logit


def exit_positions(num_layers: int, num_positions: int, exit_stride: int) -> np.ndarray:
    """[L, n] the positions exit e (row e - 1) is scored on: t ≡ e - 1 (mod stride)."""
    n = num_positions // exit_stride
    return (np.arange(n)[None, :] * exit_stride
            + (np.arange(num_layers) % exit_stride)[:, None]).astype(np.int32)


def exit_losses(params: Params, cfg: ModelConfig, batch_BxT1: jax.Array, exit_stride: int = 1,
                distill_temperature: float = 1.0, keep_LxB: jax.Array | None = None,
                scored_exits: tuple[int, ...] | None = None) -> dict[str, jax.Array]:
    """Per-exit loss terms [L] of one batch (float32), each a mean over scored tokens.

    Returns {"ce": next-token cross entropy (exit L over every position, exit e < L over
    its `exit_positions`), "kl": T² · KL(final ‖ exit) at temperature
    `distill_temperature` against the final layer's (gradient-stopped) distribution at the
    same positions (0 for exit L), "agreement": top-1 agreement with the final layer}.

    `scored_exits` (1-based early exits, static; None: all of 1..L-1) are the exits whose
    logits are computed at all; the others' terms are 0. On a large-vocabulary model the
    LM head at every exit costs more than the layers, so a run supervising a few exits
    (`exit_layers`) scores only those (S = len(scored_exits) below).
    """
    inputs, targets_BxT = batch_BxT1[:, :-1], batch_BxT1[:, 1:]
    L, T = cfg.num_layers, inputs.shape[1]
    pos_LxN = jnp.asarray(exit_positions(L, T, exit_stride))
    h_BxTxD, h_LxBxNxD = scan_exits(params, cfg, inputs,
                                    lambda h, index: jnp.take(h, pos_LxN[index], axis=1),
                                    keep_LxB)
    final_BxTxV = shared_head_logits(params, cfg, h_BxTxD)
    ce_final = jnp.mean(_ce(final_BxTxV, targets_BxT))

    rows_S = np.asarray(range(L - 1) if scored_exits is None
                        else [e - 1 for e in scored_exits], np.int32)
    zeros_L = jnp.zeros((L,), jnp.float32)
    if rows_S.size == 0:
        return {"ce": zeros_L.at[-1].set(ce_final), "kl": zeros_L,
                "agreement": zeros_L.at[-1].set(1.0)}
    pos_SxN = pos_LxN[rows_S]
    logits_SxBxNxV = shared_head_logits(params, cfg, h_LxBxNxD[rows_S])
    targets_SxBxN = jnp.take(targets_BxT, pos_SxN, axis=1).transpose(1, 0, 2)
    ce_S = jnp.mean(_ce(logits_SxBxNxV, targets_SxBxN), axis=(1, 2))

    teacher_SxBxNxV = jax.lax.stop_gradient(
        jnp.take(final_BxTxV, pos_SxN, axis=1).transpose(1, 0, 2, 3))
    t = distill_temperature
    teacher = Targets(log_probs=jax.nn.log_softmax(teacher_SxBxNxV / t, axis=-1))
    kl_S = t**2 * jnp.mean(kl_per_token(teacher, logits_SxBxNxV, t), axis=(1, 2))
    agree_S = jnp.mean(jnp.argmax(logits_SxBxNxV, -1) == jnp.argmax(teacher_SxBxNxV, -1),
                       axis=(1, 2))
    return {"ce": zeros_L.at[rows_S].set(ce_S).at[-1].set(ce_final),
            "kl": zeros_L.at[rows_S].set(kl_S),
            "agreement": zeros_L.at[rows_S].set(agree_S).at[-1].set(1.0)}


def combine_losses(terms: dict[str, jax.Array], weights_L: jax.Array,
                   distill_weight: float) -> jax.Array:
    """CE_L + sum_{e<L} w_e [(1 - alpha) CE_e + alpha KL_e] (module doc); `weights_L[-1]`
    weighs the final layer's CE."""
    early = (1.0 - distill_weight) * terms["ce"][:-1] + distill_weight * terms["kl"][:-1]
    return weights_L[-1] * terms["ce"][-1] + jnp.sum(weights_L[:-1] * early)


def exit_cross_entropies(params: Params, cfg: ModelConfig, batch_BxT1: jax.Array,
                         exit_stride: int = 1) -> jax.Array:
    """Mean next-token cross entropy [L] of the shared head at every exit (float32); exit
    e < L over its `exit_positions`, exit L over every position."""
    return exit_losses(params, cfg, batch_BxT1, exit_stride)["ce"]


def validate_recipe(config: ml_collections.ConfigDict, num_layers: int) -> None:
    """ValueError naming the key for a recipe setting out of range (before any compile)."""
    if config.exit_weights not in EXIT_WEIGHT_SCHEMES:
        raise ValueError(f"exit_weights {config.exit_weights!r} is not one of "
                         f"{EXIT_WEIGHT_SCHEMES}")
    if config.curriculum not in CURRICULA:
        raise ValueError(f"curriculum {config.curriculum!r} is not one of {CURRICULA}")
    if config.curriculum == "rotational" and config.curriculum_rotation < 1:
        raise ValueError(f"curriculum_rotation must be >= 1, got {config.curriculum_rotation}")
    if not 0.0 <= config.distill_weight <= 1.0:
        raise ValueError(f"distill_weight must be in [0, 1], got {config.distill_weight}")
    if config.distill_temperature <= 0:
        raise ValueError(f"distill_temperature must be > 0, got {config.distill_temperature}")
    if not 0.0 <= config.layer_dropout_max < 1.0:
        raise ValueError(f"layer_dropout_max must be in [0, 1), got {config.layer_dropout_max}")
    if config.exit_stride < 1:
        raise ValueError(f"exit_stride must be >= 1, got {config.exit_stride}")
    parse_exit_layers(config.exit_layers, num_layers)
