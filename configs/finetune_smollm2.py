"""Continued pretraining of SmolLM2-135M-Instruct with the early-exit loss (issue 12, item 5):
the LayerSkip recipe on a real pretrained model that was never trained to exit early.

    M=$(hispec pull smollm2-135m-instruct)
    hispec convert "$M" ~/.cache/hispec_jax/smol_exp/smollm2_hf     # float32 HF directory
    hispec pretrain --config configs/finetune_smollm2.py    # reads it, writes .../smollm2_ee

Keeps SmolLM2's architecture and tokenizer (`init_from` must match `model` below field for
field) and trains every weight (the tied embedding / LM head included) on the ShareGPT
training split in the project's `User: ... / Assistant: ...` format, with KL distillation
from the final layer to a few exits (the term that moved agreement in
docs/early_exit_recipes.md). Only the supervised exits' logits are computed: with
V = 49,152 the LM head costs 8 layers, so scoring all 29 exits would cost more than the
model. The budget is wall clock (45 minutes on one core of the shared CPU machine).

What this recipe as written did in a 98-step CPU run (BENCHMARKS.md, "SmolLM2-135M-Instruct:
continued early-exit pretraining on one CPU core", a record without kept output): the
supervised exits' agreement with the final layer rose, but the final layer's held-out
perplexity rose about tenfold: peak_lr and exit_loss_scale are too aggressive for a short
run. docs/smollm2_early_exit.md lists what the next run should change and the GPU command
(overrides of this file); its section 7 is the gentler variant
(--config.optim.peak_lr=3e-5 --config.exit_loss_scale=1.0 --config.optim.frozen=embed).
"""

import ml_collections


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()

    # Architecture: exactly the fields of hispec_jax.ModelConfig, as SmolLM2-135M's
    # config.json (converted from the GGUF by `hispec convert`).
    m = c.model = ml_collections.ConfigDict()
    m.model_type = "llama"
    m.vocab_size = 49152
    m.hidden_size = 576
    m.intermediate_size = 1536
    m.num_layers = 30
    m.num_heads = 9
    m.num_kv_heads = 3
    m.head_dim = 64
    m.rms_norm_eps = 1e-5
    m.rope_theta = 100000.0
    m.rope_scaling = None
    m.max_position_embeddings = 8192
    m.tie_word_embeddings = True
    m.qk_norm = False
    m.dtype = "float32"

    # Data: ShareGPT training split, tokenized with the init_from model's tokenizer, packed.
    # Short rows and small batches: on one CPU core a step of 256 tokens takes seconds, so
    # more (smaller) optimizer steps move the exits further than few large ones.
    d = c.data = ml_collections.ConfigDict()
    d.seq_len = 128
    d.batch_size = 2
    d.max_train_docs = 4000       # far more than a CPU run sees (0: every conversation)
    d.max_eval_docs = 200
    d.tokenizer_train_docs = 4000  # unused: the init_from model's tokenizer is kept
    d.seed = 1
    d.token_cache_dir = ""        # "": work_dir/token_cache
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
    c.exit_loss_scale = 4.0        # sum of the early-exit weights w_e (1 per exit below)
    c.exit_weights = "uniform"     # w_e ∝ e ("linear"), 1 ("uniform") or sqrt(e) ("sqrt")
    c.exit_layers = "8,15,22,26"   # the exits the decoders draft from (bench: 8/15/22)
    c.distill_weight = 1.0         # alpha: pure KL(final ‖ exit), as finetune_default
    c.distill_temperature = 1.0    # T of the distillation term
    c.curriculum = "none"          # four exits: every one at every step
    c.curriculum_rotation = 2      # R of the rotational curriculum (unused with "none")
    c.layer_dropout_max = 0.0      # off: a short run on a trained model; see the doc
    c.exit_stride = 1              # every position scored at every supervised exit
    c.init_from = "~/.cache/hispec_jax/smol_exp/smollm2_hf"  # `hispec convert` of the pulled GGUF

    # Optimizer: clip_by_global_norm -> AdamW with a warmup-cosine learning rate. A
    # fine-tuning rate: moves the exits without wrecking the final layer.
    o = c.optim = ml_collections.ConfigDict()
    o.peak_lr = 2e-4
    o.end_lr_fraction = 0.1
    o.warmup_steps = 10
    o.weight_decay = 0.0           # a few hundred steps from a trained model: no decay
    o.b1 = 0.9
    o.b2 = 0.95
    o.clip_norm = 1.0
    o.frozen = ""                  # comma-separated parameter groups kept fixed, e.g. "embed"

    c.num_steps = 100000
    # > 0: a wall-clock budget for training (all resumed runs together): the cosine follows
    # max(step / num_steps, elapsed / time_budget_s) and training stops when that reaches 1.
    c.time_budget_s = 2700.0
    c.time_limit_s = 0.0           # > 0: stop this run after this many seconds (schedule unchanged)
    c.init_std = 0.02              # unused with init_from
    c.seed = 0
    c.log_every = 10
    c.checkpoint_every = 50        # steps between training-state snapshots in work_dir
    c.eval_batches = 8             # held-out batches for the final evaluation
    c.save_dtype = "float32"       # as the converted init model: compare like with like
    c.resume = True                # continue from work_dir's snapshot when there is one
    c.out_dir = "~/.cache/hispec_jax/smol_exp/smollm2_ee"
    c.work_dir = "~/.cache/hispec_jax/smol_exp/work_ee"

    if variant is not None:
        raise ValueError(f"unknown pretrain config variant {variant!r} (this config has none)")
    return c
