"""Studies: benchmark tools that answered one question, whose answer is recorded (BENCHMARKS.md,
docs/gguf.md, docs/default_model.md, docs/smollm2_early_exit.md). They stay runnable, as
`hispec bench-tool TOOL`, to repeat the measurement on another model or machine:

    before-after    before_after.py     AR speed of two source trees side by side
    gguf-memory     gguf_memory.py      host memory of loading and decoding a GGUF model
    exit-agreement  exit_agreement.py   per-exit agreement on held-out rows (training eval)
    plot-agreement  plot_agreement.py   agreement curves of `hispec pretrain` summaries
"""
