"""Llama 3.1 8B (meta-llama/Llama-3.1-8B): Llama 3 8B shapes, 128K context, llama3 RoPE scaling."""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model_type = "llama"
    c.vocab_size = 128256
    c.hidden_size = 4096
    c.intermediate_size = 14336
    c.num_layers = 32
    c.num_heads = 32
    c.num_kv_heads = 8
    c.head_dim = 128
    c.rms_norm_eps = 1e-5
    c.rope_theta = 500000.0
    c.rope_scaling = ml_collections.ConfigDict()
    c.rope_scaling.rope_type = "llama3"
    c.rope_scaling.factor = 8.0
    c.rope_scaling.low_freq_factor = 1.0
    c.rope_scaling.high_freq_factor = 4.0
    c.rope_scaling.original_max_position_embeddings = 8192
    c.max_position_embeddings = 131072
    c.tie_word_embeddings = False
    c.qk_norm = False
    c.dtype = "bfloat16"
    c.matmul_precision = "highest"  # exact float32 matmuls on GPU/TPU too (ModelConfig)
    c.flat_attention_output = False  # a layout choice (ModelConfig)
    return c
