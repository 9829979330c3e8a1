"""A batch of prompts and per-sequence settings, as device arrays (a pytree, never static)."""

from __future__ import annotations

import flax.struct
import jax

from hispec_jax.decoding.gate import PassCost, default_pass_cost
from hispec_jax.decoding.sampling import SamplingArrays
from hispec_jax.decoding.suffix_store import StoreArrays


@flax.struct.dataclass
class Request:
    """What every compiled decoding loop receives.

    Attributes:
      tokens_BxS: [B, S] int32, prompts right-padded into the cache capacity S.
      prompt_lens_B: [B] int32, prompt lengths (>= 1).
      max_new_B: [B] int32, `max_new_tokens` per sequence (0 for batch-padding rows).
      eos_ids_E: [E] int32, EOS token ids, padded with -1; or [B, E], each sequence's own
        (the server's slots: a request with `ignore_eos` has none, all -1).
      sequence_keys_Bx2: [B, 2] uint32 raw PRNG keys, one per sequence.
      sampling: temperature / top-k / top-p as scalars.
      lookup_cost: the device's verification-pass costs the acceptance gates weigh (the
        lookup drafter's, and the exit drafter's where it is on) ([] float32 F and J,
        `gate.PassCost`; default: the backend's).
      min_new_B: [B] int32, new tokens before which a sequence's EOS is suppressed
        (`emit.suppress_eos`: the server's `min_tokens`), or None (offline loops: no
        suppression, nothing compiled for it).
      store: earlier requests' tokens the lookup drafter also drafts from
        (`suffix_store.StoreArrays`: [R] tokens and scopes, each sequence's [B] scope), or
        None (offline loops: nothing compiled for it). A new store of the same R never
        recompiles.
    """

    tokens_BxS: jax.Array
    prompt_lens_B: jax.Array
    max_new_B: jax.Array
    eos_ids_E: jax.Array
    sequence_keys_Bx2: jax.Array
    sampling: SamplingArrays
    lookup_cost: PassCost = flax.struct.field(default_factory=default_pass_cost)
    min_new_B: jax.Array | None = None
    store: StoreArrays | None = None
