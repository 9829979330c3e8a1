"""Autoregressive decoding from any exit, as one compiled `lax.while_loop`.

`exit_layer = L` is plain autoregressive decoding; `exit_layer < L` is LayerSkip's lossy
"early-exit inference" (`method=exit`): only layers [0, exit_layer) run and are cached, and
the exit head of `exit_layer` picks the tokens.

Per round every unfinished sequence feeds its newest token (position length - 1, the one
token not yet in the cache) through the layers and appends one token.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

from hispec_jax.decoding import emit
from hispec_jax.decoding.prefill import prefill
from hispec_jax.decoding.request import Request
from hispec_jax.decoding.sampling import choose_tokens, position_keys
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.transformer import embed, run_layers


@flax.struct.dataclass
class ARState:
    """Loop state.

    Attributes:
      out: the output buffer (tokens [B, S], lengths [B], num_new [B], done [B]).
      cache: KV cache of layers [0, exit_layer): [exit_layer, B, S, K, H].
      rounds: [] int32, loop iterations so far.
    """

    out: emit.Output
    cache: KVCache
    rounds: jax.Array


def _next_tokens(params, heads, cfg, h_BxD, req: Request, positions_B, exit_layer, greedy):
    logits_BxV = exit_logits(params, heads, cfg, h_BxD[:, None], exit_layer)[:, 0]
    keys_Bx2 = position_keys(req.sequence_keys_Bx2, positions_B)
    return choose_tokens(logits_BxV, greedy, req.sampling, keys_Bx2)


@functools.partial(jax.jit, static_argnames=("cfg", "exit_layer", "greedy", "prompt_block"))
def generate_autoregressive(params, heads, req: Request, cache: KVCache, *, cfg: ModelConfig,
                            exit_layer: int, greedy: bool, prompt_block: int) -> ARState:
    """Prefill + token-by-token decoding until every sequence is done.

    Args:
      params, heads: model parameters and exit heads.
      req: the batch (prompt tokens in `req.tokens_BxS[:, :prompt_block]`, lengths, budgets,
        EOS ids, PRNG keys, sampling settings).
      cache: an empty cache with at least `exit_layer` layers and capacity S.
      cfg, exit_layer, greedy, prompt_block: static.
    """
    with jax.named_scope("prefill"):
        h_BxD, cache = prefill(params, cfg, req.tokens_BxS[:, :prompt_block], req.prompt_lens_B,
                               cache, exit_layer)
        first_B = _next_tokens(params, heads, cfg, h_BxD, req, req.prompt_lens_B, exit_layer, greedy)
        out = emit.start_output(req.tokens_BxS, req.prompt_lens_B, req.max_new_B)
        out, _ = emit.append_block(out, first_B[:, None], jnp.ones_like(first_B), req.eos_ids_E,
                                   req.max_new_B)
    state = ARState(out=out, cache=cache, rounds=jnp.zeros((), jnp.int32))

    def cond(state: ARState):
        return jnp.any(~state.out.done_B)

    def body(state: ARState):
        out = state.out
        newest_B = out.lengths_B - 1
        token_B = jnp.take_along_axis(out.tokens_BxS, newest_B[:, None], axis=1)[:, 0]
        positions_B = jnp.where(out.done_B, state.cache.capacity, newest_B)
        with jax.named_scope("decode_step"):
            h_Bx1xD, cache = run_layers(params, cfg, embed(params, token_B[:, None]),
                                        positions_B[:, None], state.cache, 0, exit_layer)
            next_B = _next_tokens(params, heads, cfg, h_Bx1xD[:, 0], req, out.lengths_B,
                                  exit_layer, greedy)
        out, _ = emit.append_block(out, next_B[:, None], jnp.ones_like(next_B), req.eos_ids_E,
                                   req.max_new_B)
        return ARState(out=out, cache=cache, rounds=state.rounds + 1)

    return jax.lax.while_loop(cond, body, state)
