"""`hispec profile-sv`: the offline profile SV decodes with (`decoding/sv.py`).

One teacher-forced pass over the model's own greedy continuations of calibration prompts
(the positions greedy speculation sees once its drafts were accepted) gives, per position,
the draft exit's distribution p_d, the companion exit's p_c and the final layer's p_t. For
the draft token x = argmax p_d:

    S = sum_v min(p_d(v), p_c(v)),   A = min(1, p_c(x) / p_d(x))
    greedy acceptance    1[x == argmax p_t]
    sampling acceptance  min(1, p_t(x) / p_d(x))

(S, A) are binned into equal-count bins and the mean acceptance per bin is the table; the
cost of a layer and of an exit head per block length (`calibrate.measure_stage_costs`) is
the latency model that turns expected accepted tokens into goodput. The profile is saved as
`sv_profile.json` in the model directory (or where `--out` says).

`profile_for` is what `hispec generate --method sv` uses, so SV works on any model: the
model directory's profile when it is for the requested exits, else one cached for (model,
device, exits) in `$HISPEC_CACHE/sv_profiles/`, else a quick profile made now (progress
reported, then cached there).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax.decoding import generate as generate_lib
from hispec_jax.decoding import methods
from hispec_jax.decoding import sv as sv_lib
from hispec_jax.models.heads import exit_logits
from hispec_jax.models import sharding
from hispec_jax.models.model import Model
from hispec_jax.models.params import with_layer_layout
from hispec_jax.models.transformer import scan_exits
from hispec_jax.planner import calibrate
from hispec_jax.planner import plan as plan_lib
from hispec_jax.planner.latency import Costs


@functools.partial(jax.jit, static_argnames=("model_cfg", "exits"))
def _signals(params, heads, tokens_BxT, *, model_cfg, exits):
    """[B, T] S, A, greedy acceptance and sampling acceptance at every position."""
    params = with_layer_layout(params, "scan")
    _, h_LxBxTxD = scan_exits(params, model_cfg, tokens_BxT, lambda h, index: h)
    d, c, L = exits
    logp = [jax.nn.log_softmax(exit_logits(params, heads, model_cfg, h_LxBxTxD[e - 1], e)
                               .astype(jnp.float32), -1) for e in (d, c, L)]
    logp_d, logp_c, logp_t = logp
    x = jnp.argmax(logp_d, -1)[..., None]
    at = lambda lp: jnp.take_along_axis(lp, x, -1)[..., 0]
    S = jnp.sum(jnp.minimum(jnp.exp(logp_d), jnp.exp(logp_c)), -1)
    A = jnp.exp(jnp.minimum(at(logp_c) - at(logp_d), 0.0))
    greedy_ok = (jnp.argmax(logp_t, -1) == x[..., 0])
    sampling = jnp.exp(jnp.minimum(at(logp_t) - at(logp_d), 0.0))
    return S, A, greedy_ok, sampling


def profile_sv(model: Model, draft_exit: int | None = None, companion_exit: int | None = None,
               *, batch_size: int = 1, prompts: list[list[int]] | None = None,
               settings: calibrate.Settings = calibrate.Settings(), s_bins: int = 20,
               a_bins: int = 10, progress=None) -> sv_lib.SVTable:
    """Profiles SV signals and stage costs for (draft_exit, companion_exit, L)."""
    tick = progress or (lambda msg: None)
    t0 = time.perf_counter()
    L = model.cfg.num_layers
    default_d, default_c = methods.default_exits(model)
    d = default_d if draft_exit is None else draft_exit
    c = default_c if companion_exit is None else companion_exit
    for name, e in (("draft_exit", d), ("verify_exits", c)):
        methods.check_exit(model, name, e, below_top=True)
    if c is None or not d < c < L:
        raise ValueError(f"SV needs draft_exit < companion exit < {L}, got {d}, {c}")
    s = settings
    if prompts is None:
        prompts = calibrate.calibration_prompts(model, s.num_prompts, s.max_prompt_tokens)
    capacity = min(s.capacity, model.cfg.max_position_embeddings)
    tick("AR continuations of the calibration prompts")
    ar = generate_lib.generate(model, prompts, method="ar", max_new_tokens=s.new_tokens,
                               ignore_eos=True, max_cache_len=capacity)
    sequences = [p + t for p, t in zip(ar.prompt_token_ids, ar.token_ids)]
    tick("signals at every continuation position")
    T = max(16, 1 << (max(map(len, sequences)) - 1).bit_length())
    cols = [[], [], [], []]
    for seq, prompt in zip(sequences, ar.prompt_token_ids):
        tokens = np.zeros((1, T), np.int32)
        tokens[0, :len(seq)] = seq
        out = sharding.host_values(_signals(model.params, model.heads, tokens,
                                            model_cfg=model.cfg, exits=(d, c, L)))
        keep = slice(max(len(prompt) - 1, 0), len(seq) - 1)  # predictions of the continuation
        for col, values in zip(cols, out):
            col.append(np.asarray(values)[0, keep])
    S, A, greedy_ok, sampling = (np.concatenate(col) for col in cols)
    tick("stage costs (layers, exit head) per block length")
    layer_s, head_s = calibrate.measure_stage_costs(
        model, batch_size, capacity, s.block_sizes, s.repeats,
        context=min(capacity // 2, s.max_prompt_tokens + s.new_tokens // 2))
    costs = Costs(batch=batch_size, num_layers=L, block_sizes=tuple(s.block_sizes),
                  layer_s=tuple(layer_s), head_s=tuple(head_s),
                  head_scale=calibrate.head_cost_scales(model))
    meta = {"prompts": len(prompts), "positions": int(S.size), "model": plan_lib.model_key(model),
            "device": plan_lib.device_key(), "batch_size": batch_size,
            "seconds": round(time.perf_counter() - t0, 2),
            "mean_greedy_acceptance": round(float(greedy_ok.mean()), 4) if S.size else None}
    return sv_lib.build_table(S, A, greedy_ok, sampling, d, c, costs.to_json(), s_bins=s_bins,
                              a_bins=a_bins, meta=meta)


def cache_path(model: Model, draft_exit: int, companion_exit: int) -> Path:
    """Where `profile_for` caches the profile of (model, this device, exits)."""
    return (plan_lib.cache_dir().parent / "sv_profiles" /
            f"{plan_lib.model_key(model)}-{plan_lib.device_key()}-e{draft_exit}-{companion_exit}.json")


def profile_for(model: Model, draft_exit: int | None = None, companion_exit: int | None = None,
                *, progress=None) -> sv_lib.SVTable:
    """The SV profile for (draft_exit, companion_exit) of `model` (defaults as `generate`'s):
    the model directory's `sv_profile.json` if it is for these exits, else the one cached
    for this model and device, else a quick profile (`calibrate.Settings.quick()`) made now
    and cached. `progress(msg)` hears what happens when one is made (nothing otherwise).
    ValueError for exits SV cannot use."""
    return profile_with_source(model, draft_exit, companion_exit, progress=progress)[0]


def profile_with_source(model: Model, draft_exit: int | None = None,
                        companion_exit: int | None = None, *,
                        progress=None) -> tuple[sv_lib.SVTable, str]:
    """`profile_for`'s table and where it came from, for a result's stats: "model
    directory: PATH", "cached quick profile: PATH" or "quick profile made now: PATH"."""
    default_d, default_c = methods.default_exits(model)
    d = default_d if draft_exit is None else draft_exit
    c = default_c if companion_exit is None else companion_exit
    if model.path is not None:
        try:
            own = sv_lib.find_table(model.path)
        except FileNotFoundError:
            own = None
        if own is not None and (own.draft_exit, own.companion_exit) == (d, c):
            directory = Path(model.path)
            directory = directory.parent if directory.is_file() else directory
            return own, f"model directory: {directory / sv_lib.PROFILE_FILE}"
    path = cache_path(model, d, c) if c is not None else None
    if path is not None and path.is_file():
        return sv_lib.SVTable.load(path), f"cached quick profile: {path}"
    tick = progress or (lambda msg: None)
    tick(f"no SV profile of this model for exits ({d}, {c}) on this device: making a quick "
         "one (`hispec profile-sv` makes a full one)")
    table = profile_sv(model, d, c, settings=calibrate.Settings.quick(), progress=tick)
    path.parent.mkdir(parents=True, exist_ok=True)
    tick(f"saved it to {table.save(path)} (used from there next time)")
    return table, f"quick profile made now: {path}"
