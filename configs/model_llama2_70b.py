"""Llama 2 70B (meta-llama/Llama-2-70b-hf; facebook/layerskip-llama2-70B has the same shapes)."""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model_type = "llama"
    c.vocab_size = 32000
    c.hidden_size = 8192
    c.intermediate_size = 28672
    c.num_layers = 80
    c.num_heads = 64
    c.num_kv_heads = 8
    c.head_dim = 128
    c.rms_norm_eps = 1e-5
    c.rope_theta = 10000.0
    c.rope_scaling = None
    c.max_position_embeddings = 4096
    c.tie_word_embeddings = False
    c.qk_norm = False
    c.dtype = "bfloat16"
    c.matmul_precision = "highest"  # exact float32 matmuls on GPU/TPU too (ModelConfig)
    c.flat_attention_output = False  # a layout choice (ModelConfig)
    return c
