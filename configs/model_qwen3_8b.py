"""Qwen3 8B (Qwen/Qwen3-8B): q/k RMSNorm, untied LM head."""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model_type = "qwen3"
    c.vocab_size = 151936
    c.hidden_size = 4096
    c.intermediate_size = 12288
    c.num_layers = 36
    c.num_heads = 32
    c.num_kv_heads = 8
    c.head_dim = 128
    c.rms_norm_eps = 1e-6
    c.rope_theta = 1000000.0
    c.rope_scaling = None
    c.max_position_embeddings = 40960
    c.tie_word_embeddings = False
    c.qk_norm = True
    c.dtype = "bfloat16"
    c.matmul_precision = "highest"  # exact float32 matmuls on GPU/TPU too (ModelConfig)
    c.flat_attention_output = False  # a layout choice (ModelConfig)
    return c
