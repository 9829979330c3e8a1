"""Exit-head distillation, HiSpec App. I setup (`hispec train-heads`; SPEC.md §8).

    hispec train-heads --config configs/train_heads_default.py --config.model_path=DIR
    hispec train-heads --config configs/train_heads_default.py --config.model_path=DIR \
        --config.head_layers=4,8 --config.head_rank=0 --config.feature_cache=True

Paper (Qwen3-8B): low-rank heads (rank 1024) at layers {3, 7, ..., 31}, KL against the final
layer at temperature 2.0, AdamW at 1e-4 with a cosine schedule and 100 warmup steps, batch
4, 100K ShareGPT samples (the packaged ShareGPT file holds ~17.6K complete conversations),
16 epochs. Exit e reads the residual stream after the first e layers (our exit numbering).

The feature cache is off here: at this scale it holds E·D·2 bytes per token (8 heads × 4096
× bf16 = 64 KiB/token, plus 516 B of top-64 targets) — terabytes for all of ShareGPT.
Turn it on for smaller models, fewer heads or fewer rows (`max_train_docs`); `cache_max_gb`
refuses to build a cache larger than that.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    # Model and output.
    c.model_path = ""             # local HF model directory (required)
    c.model_dtype = ""            # "": the checkpoint's dtype; or "float32" / "bfloat16"
    c.output_dir = ""             # "": write exit_heads.safetensors into model_path; else copy
                                  # the model there and add the heads
    # Heads.
    c.head_layers = (3, 7, 11, 15, 19, 23, 27, 31)
    c.head_rank = 1024            # 0: full D x V heads
    c.head_adapter_width = 0      # > 0: a residual MLP block of this width before the
                                  # head's norm + projection (0: none)
    c.head_adapter_act = "swiglu" # the adapter's MLP: "swiglu" | "gelu"
    c.head_projection = "own"     # "own": a trained norm + LM head copy (full / head_rank);
                                  # "shared": the model's frozen one (needs an adapter)
    # Loss: T^2 * KL(final || exit) at temperature T, over the teacher's top-k + a tail bucket.
    c.temperature = 2.0
    c.target_top_k = 64           # 0: exact full-vocabulary KL
    c.loss = "kl"                 # or "ce": cross-entropy on the final layer's greedy token
    # Optimizer: clip_by_global_norm -> AdamW, linear warmup then cosine decay.
    c.learning_rate = 1e-4
    c.end_lr_fraction = 0.0
    c.warmup_steps = 100
    c.weight_decay = 0.0          # projections only; heads start at the LM head, not at 0
    c.adam_b1 = 0.9
    c.adam_b2 = 0.999
    c.adam_eps = 1e-8
    c.grad_clip_norm = 1.0
    # Data.
    c.batch_size = 4
    c.seq_len = 2048
    c.num_epochs = 16
    c.total_steps = 0             # 0: num_epochs x batches per epoch
    c.data_source = "sharegpt"    # "sharegpt" | "random"
    c.max_train_docs = 0          # 0: every ShareGPT training conversation
    c.random_train_rows = 1024    # rows of random tokens (data_source="random")
    c.eval_rows = 64              # held-out rows (ShareGPT evaluation split / random)
    # Feature cache (frozen-base hidden states + top-k targets on disk, reused every epoch).
    c.feature_cache = False
    c.cache_dir = "~/.cache/hispec_jax/feature_cache"
    c.cache_dtype = "bfloat16"    # hidden states: "bfloat16" | "float32"
    c.cache_max_gb = 200.0
    # Checkpoints, evaluation, logging.
    c.workdir = "~/.cache/hispec_jax/train_heads"   # checkpoints/ and metrics.jsonl
    c.resume = True               # continue from workdir's newest checkpoint
    c.checkpoint_every = 1000
    c.keep_checkpoints = 2
    c.async_checkpoint = True
    c.eval_every = 2000           # 0: evaluate only before training and at the end
    c.seed = 0
    c.progress_bar = True
    return c
