"""Exit-head distillation smoke run: a few steps on random tokens (tests, quick checks).

    hispec train-heads --config configs/train_heads_small.py --config.model_path=DIR \
        --config.workdir=runs/heads_small

Meant for tiny models (`hispec init-model`): two low-rank heads at exits 1 and 2, the
feature cache on (float32, so it matches the uncached pipeline), checkpoints every 5 steps.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model_path = ""
    c.model_dtype = "float32"
    c.output_dir = ""
    c.head_layers = (1, 2)
    c.head_rank = 16
    c.head_adapter_width = 0      # > 0: an adapter block of this width in each head
    c.head_adapter_act = "swiglu"
    c.head_projection = "own"     # or "shared" (adapter + the model's own LM head)
    c.temperature = 2.0
    c.target_top_k = 16
    c.loss = "kl"                 # or "ce": cross-entropy on the final layer's greedy token
    c.learning_rate = 3e-3
    c.end_lr_fraction = 0.1
    c.warmup_steps = 2
    c.weight_decay = 0.0
    c.adam_b1 = 0.9
    c.adam_b2 = 0.999
    c.adam_eps = 1e-8
    c.grad_clip_norm = 1.0
    c.batch_size = 2
    c.seq_len = 16
    c.num_epochs = 0
    c.total_steps = 30
    c.data_source = "random"
    c.max_train_docs = 0
    c.random_train_rows = 32
    c.eval_rows = 4
    c.on_policy_prompts = 8       # data_source="on_policy": the model's own continuations
    c.on_policy_new_tokens = 16
    c.on_policy_sampling = "greedy"
    c.on_policy_temperature = 1.0
    c.on_policy_batch = 8
    c.feature_cache = True
    c.cache_dir = "~/.cache/hispec_jax/feature_cache"
    c.cache_dtype = "float32"
    c.cache_max_gb = 1.0
    c.workdir = "~/.cache/hispec_jax/train_heads_small"
    c.resume = True
    c.checkpoint_every = 5
    c.keep_checkpoints = 2
    c.async_checkpoint = True
    c.eval_every = 10
    c.seed = 0
    c.progress_bar = True
    return c
