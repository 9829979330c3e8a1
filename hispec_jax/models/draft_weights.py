"""A draft model's weights inside its target's parameters, and the check that the two can be
paired (speculative decoding with a small model of the same family as the drafter).

The draft travels as `params["draft"]`, a `DraftWeights` node (its architecture is static
pytree metadata), so every path that takes a model's parameters takes its draft with them:
the compiled loops' arguments and compile keys (`Engine.params_signature`), sharding over a
mesh by the same rule table (`sharding.param_axes`), the serving slots' programs. The draft
model drafter (`decoding/engine/draft_model.py`) reads it there.

    target.params = {"embed": ..., "layers": ..., "final_norm": ..., ["lm_head": ...],
                     "draft": DraftWeights(params={"embed": ..., "layers": ...}, cfg=draft_cfg)}

A pair must share the vocabulary: the draft proposes token ids the target verifies, so the
vocabulary size and the ids of the special tokens the chat template and the stop rules use
(EOS, BOS, the end-of-turn markers: every added token of the target's tokenizer) must be the
same (`check_pair`). Llama-3.2-1B drafts for Llama-3.1-8B, Qwen3-0.6B for Qwen3-8B, SmolLM2-135M
for SmolLM2-1.7B.
"""

from __future__ import annotations

from typing import Any

import flax.struct

from hispec_jax.models.config import ModelConfig


@flax.struct.dataclass
class DraftWeights:
    """A draft model's parameters as a node of its target's parameter pytree.

    Attributes:
      params: the draft's parameter pytree (`params.py`, any layer layout).
      cfg: the draft's architecture (static: part of the tree definition, so of every
        compile key that includes the target's parameters).
    """

    params: Any
    cfg: ModelConfig = flax.struct.field(pytree_node=False)

    @property
    def per_layer(self) -> bool:
        """Whether its layers are a tuple of per-layer dicts ("unrolled"): its KV cache
        follows (`KVCache.zeros(per_layer=)`)."""
        return isinstance(self.params["layers"], (tuple, list))


def check_pair_configs(target: ModelConfig, draft: ModelConfig) -> None:
    """Raises ValueError when `draft` cannot draft for `target` by their configs alone (read
    before any weight: `weight_memory.read_config`)."""
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"the draft model's vocabulary has {draft.vocab_size} entries, the "
                         f"target's {target.vocab_size}: a draft model must share its target's "
                         "vocabulary (a smaller model of the same family)")


def _special_ids(tokenizer) -> dict[str, int]:
    """Every special and added token of a HF tokenizer with its id."""
    ids = {str(tok): int(i) for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    for tok in getattr(tokenizer, "all_special_tokens", ()):
        ids.setdefault(str(tok), int(tokenizer.convert_tokens_to_ids(tok)))
    return ids


def check_pair(target, draft) -> None:
    """Raises ValueError (one line, naming the difference) unless the `Model` `draft` can
    draft for the `Model` `target`: the same vocabulary size, the same EOS ids, and (when
    both have tokenizers) every special or added token of the target with the same id in
    the draft's tokenizer."""
    check_pair_configs(target.cfg, draft.cfg)
    if target.eos_token_ids and draft.eos_token_ids and (
            set(target.eos_token_ids) != set(draft.eos_token_ids)):
        raise ValueError(f"the draft model's EOS ids {list(draft.eos_token_ids)} differ from the "
                         f"target's {list(target.eos_token_ids)}: not the same vocabulary")
    if target.tokenizer is None or draft.tokenizer is None:
        return
    theirs = _special_ids(draft.tokenizer)
    vocab = None
    for tok, i in sorted(_special_ids(target.tokenizer).items(), key=lambda kv: kv[1]):
        j = theirs.get(tok)
        if j is None:  # a plain token in the draft's vocabulary is fine at the same id
            vocab = vocab if vocab is not None else draft.tokenizer.get_vocab()
            j = vocab.get(tok)
        if j != i:
            raise ValueError(f"special token {tok!r} is id {i} in the target's tokenizer but "
                             f"{'absent' if j is None else f'id {j}'} in the draft model's: "
                             "a draft model must share its target's vocabulary")
