"""Tiny random Llama-architecture model for smoke runs (`hispec init-model`).

Vocabulary: the byte-level tokenizer of `hispec_jax.models.presets.byte_tokenizer`,
<unk>=0, <s>=1, </s>=2 and the 256 bytes at 3..258. With random weights its output is
random text; it exists so a fresh machine can exercise every code path without a download.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model_type = "llama"
    c.vocab_size = 259
    c.hidden_size = 256
    c.intermediate_size = 512
    c.num_layers = 8
    c.num_heads = 4
    c.num_kv_heads = 2
    c.head_dim = 64
    c.rms_norm_eps = 1e-5
    c.rope_theta = 10000.0
    c.rope_scaling = None
    c.max_position_embeddings = 2048
    c.tie_word_embeddings = False
    c.qk_norm = False
    c.dtype = "float32"
    c.matmul_precision = "highest"  # exact float32 matmuls on GPU/TPU too (ModelConfig)
    c.flat_attention_output = False  # a layout choice (ModelConfig)
    return c
