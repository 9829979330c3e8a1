"""Training code: ShareGPT data and packing (`data`), pretraining the default model
(`pretrain`), and exit-head distillation (HiSpec App. I):

    config    configs/train_heads_*.py loading, --config.KEY=VALUE overrides, validation
    rows      token rows (ShareGPT or random) and the per-step batch order
    heads     initial heads: copies of the final norm + LM head (truncated SVD for low rank)
    losses    T²·KL(final ‖ exit) at temperature T, full-vocabulary or top-k + tail bucket
    features  frozen-base hidden states / targets, and their on-disk cache
    steps     the optax optimizer (heads only) and the jitted train / eval steps
    checkpoint  orbax CheckpointManager of heads, optimizer state, data position, RNG
    train     `train(config)`: the loop, evaluation, resume, saving the heads (`hispec train-heads`)
"""
