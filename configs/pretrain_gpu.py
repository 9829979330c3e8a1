"""Stage 1 of the shipped default model (v2): pretraining from scratch on one GPU.

    hispec pretrain --config configs/pretrain_gpu.py

Reproduces the 24-layer stage-1 candidate (its PROVENANCE.md, kept with that model): project commit
076f1a5 ran `configs/pretrain_default.py` with the overrides
`--config.model.num_layers=24 --config.time_budget_s=440 --config.data.batch_size=64
--config.data.seq_len=512 --config.checkpoint_every=0 --config.exit_loss_scale=8` on one
NVIDIA H100 (440 s of training, 2638 steps, 86.4 M tokens); those overrides are the values
below. The recipe keys added since (exit_weights ... layer_dropout_max) are at the values
that give exactly that loss. The budget is wall clock, so a slower accelerator sees fewer
tokens; set `--config.time_budget_s=0 --config.num_steps=2638` for a token-exact run.

Stage 2 (configs/finetune_default.py) continues this model with the improved early-exit
loss and writes hispec_jax/default_model. See docs/default_model.md.
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
    d.batch_size = 64
    d.max_train_docs = 0          # 0: every training conversation
    d.max_eval_docs = 0           # 0: every evaluation conversation
    d.tokenizer_train_docs = 4000  # conversations the BPE tokenizer is trained on
    d.seed = 0
    d.token_cache_dir = ""        # "": work_dir/token_cache (runs can share one cache)
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
    c.exit_weights = "linear"      # w_e ∝ e ("linear"), 1 ("uniform") or sqrt(e) ("sqrt")
    c.exit_layers = ""             # supervised early exits, e.g. "3,6,12"; "": all of them
    c.distill_weight = 0.0         # alpha: share of T² KL(final ‖ exit) in each exit's term
    c.distill_temperature = 1.0    # T of the distillation term
    c.curriculum = "none"          # "none", "rotational" (LayerSkip C_rot) or "gradual" (C_grad)
    c.curriculum_rotation = 2      # R of the rotational curriculum
    c.layer_dropout_max = 0.0      # LayerSkip layer dropout at the last layer (0: off)
    # Early exits are scored on every exit_stride-th position (offset by the layer index):
    # an unbiased estimate at a fraction of the cost of 15 extra LM heads.
    c.exit_stride = 4
    c.init_from = ""               # a HF model dir to continue from (its weights and tokenizer)

    # Optimizer: clip_by_global_norm -> AdamW with a warmup-cosine learning rate.
    o = c.optim = ml_collections.ConfigDict()
    o.peak_lr = 3e-3
    o.end_lr_fraction = 0.1
    o.warmup_steps = 50
    o.weight_decay = 0.1
    o.b1 = 0.9
    o.b2 = 0.95
    o.clip_norm = 1.0
    o.frozen = ""                  # comma-separated parameter groups kept fixed, e.g. "embed"

    # 440 s of wall clock on one H100: the budget, not the step count, ends the run.
    c.num_steps = 100000
    # > 0: a wall-clock budget for training (all resumed runs together): the cosine follows
    # max(step / num_steps, elapsed / time_budget_s) and training stops when that reaches 1.
    c.time_budget_s = 440.0
    c.time_limit_s = 0.0           # > 0: stop this run after this many seconds (schedule unchanged)
    c.init_std = 0.02
    c.seed = 0
    c.log_every = 200
    c.checkpoint_every = 0         # steps between training-state snapshots in work_dir
    c.eval_batches = 40            # held-out batches for the final evaluation
    c.save_dtype = "bfloat16"      # dtype of the shipped safetensors weights
    c.resume = True                # continue from work_dir's snapshot when there is one
    c.out_dir = "~/.cache/hispec_jax/pretrain_gpu/model"  # stage 2's init_from
    c.work_dir = "~/.cache/hispec_jax/pretrain_gpu"

    if variant is not None:
        raise ValueError(f"unknown pretrain config variant {variant!r} (this config has none)")
    return c
