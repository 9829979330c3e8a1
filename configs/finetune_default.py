"""Stage 2 of the shipped default model (v2): continued training with the improved
early-exit loss, on one CPU core. Writes hispec_jax/default_model.

    hispec pretrain --config configs/finetune_default.py

Starts from stage 1's model (configs/pretrain_gpu.py writes it to
~/.cache/hispec_jax/pretrain_gpu/model: `--config.init_from=PATH`), keeps its
architecture and tokenizer, and trains every weight with the recipe that won the
side-by-side comparison in docs/early_exit_recipes.md. The budget is wall clock
(40 minutes on one core of the shared 2-core development machine), so the tokens seen
depend on how busy the machine is; `--config.time_budget_s=0 --config.num_steps=N` makes a
run token-exact.
"""

import ml_collections


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()

    # Architecture: exactly the fields of hispec_jax.ModelConfig.
    m = c.model = ml_collections.ConfigDict()
    m.model_type = "llama"
    m.vocab_size = 2048
    m.hidden_size = 256
    m.intermediate_size = 704
    m.num_layers = 24
    m.num_heads = 4
    m.num_kv_heads = 2
    m.head_dim = 64
    m.rms_norm_eps = 1e-5
    m.rope_theta = 10000.0
    m.rope_scaling = None
    m.max_position_embeddings = 2048
    m.tie_word_embeddings = True
    m.qk_norm = False
    m.dtype = "float32"

    # Data: ShareGPT training split (hispec_jax.train_heads.data), packed sequences.
    d = c.data = ml_collections.ConfigDict()
    d.seq_len = 512
    d.batch_size = 4
    d.max_train_docs = 0          # 0: every training conversation
    d.max_eval_docs = 0           # 0: every evaluation conversation
    d.tokenizer_train_docs = 4000  # conversations the BPE tokenizer is trained on
    d.seed = 1
    d.token_cache_dir = "~/.cache/hispec_jax/token_cache"  # "": work_dir/token_cache
    # "sharegpt": train on the ShareGPT training split; "on_policy": on the init_from model's
    # own continuations of ShareGPT training prompts (generated once by the engine before
    # training, cached under token_cache_dir/on_policy; hispec_jax/train_heads/on_policy.py).
    # "mixed": both, the continuations repeated on_policy_repeat times per epoch.
    d.source = "sharegpt"
    d.on_policy_prompts = 1000    # first user turns of the ShareGPT training split
    d.on_policy_new_tokens = 256  # new tokens per prompt (up to EOS)
    d.on_policy_sampling = "greedy"   # "greedy" | "sampled"
    d.on_policy_temperature = 1.0     # "sampled" only
    d.on_policy_batch = 64        # prompts per generation batch
    d.on_policy_repeat = 1        # "mixed": copies of the continuations per epoch

    # Early-exit recipe (hispec_jax/train_heads/exit_recipe.py):
    # CE(final) + sum_{e<L} w_e [(1 - distill_weight) CE(exit e) + distill_weight KL_e].
    c.exit_loss_scale = 8.0        # sum of the early-exit weights w_e
    c.exit_weights = "uniform"     # w_e ∝ e ("linear"), 1 ("uniform") or sqrt(e) ("sqrt")
    c.exit_layers = ""             # supervised early exits, e.g. "3,6,12"; "": all of them
    c.distill_weight = 1.0         # alpha: share of T² KL(final ‖ exit) in each exit's term
    c.distill_temperature = 1.0    # T of the distillation term
    c.curriculum = "rotational"    # "none", "rotational" (LayerSkip C_rot) or "gradual" (C_grad)
    c.curriculum_rotation = 2      # R of the rotational curriculum
    c.layer_dropout_max = 0.1      # LayerSkip layer dropout at the last layer (0: off)
    # Early exits are scored on every exit_stride-th position (offset by the layer index):
    # an unbiased estimate at a fraction of the cost of 15 extra LM heads.
    c.exit_stride = 4
    c.init_from = "~/.cache/hispec_jax/pretrain_gpu/model"  # continue from stage 1

    # Optimizer: clip_by_global_norm -> AdamW with a warmup-cosine learning rate.
    o = c.optim = ml_collections.ConfigDict()
    o.peak_lr = 3e-4
    o.end_lr_fraction = 0.1
    o.warmup_steps = 20
    o.weight_decay = 0.1
    o.b1 = 0.9
    o.b2 = 0.95
    o.clip_norm = 1.0
    o.frozen = ""                  # comma-separated parameter groups kept fixed, e.g. "embed"

    # A 40-minute wall-clock budget on one CPU core (the cosine follows elapsed time; the
    # shipped run's step count is in docs/default_model.md).
    c.num_steps = 100000
    # > 0: a wall-clock budget for training (all resumed runs together): the cosine follows
    # max(step / num_steps, elapsed / time_budget_s) and training stops when that reaches 1.
    c.time_budget_s = 2400.0
    c.time_limit_s = 0.0           # > 0: stop this run after this many seconds (schedule unchanged)
    c.init_std = 0.02
    c.seed = 0
    c.log_every = 10
    c.checkpoint_every = 25        # steps between training-state snapshots in work_dir
    c.eval_batches = 100           # held-out batches for the final evaluation
    c.save_dtype = "bfloat16"      # dtype of the shipped safetensors weights
    c.resume = True                # continue from work_dir's snapshot when there is one
    c.out_dir = ""                 # "": the package's hispec_jax/default_model
    c.work_dir = "~/.cache/hispec_jax/finetune_default"

    if variant is not None:
        raise ValueError(f"unknown pretrain config variant {variant!r} (this config has none)")
    return c
