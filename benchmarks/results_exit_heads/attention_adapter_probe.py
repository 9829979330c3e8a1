"""Would attention help SmolLM2's exit-15 head? A teacher-forced probe (issue 31, item 6).

    python benchmarks/results_exit_heads/attention_adapter_probe.py \
        > benchmarks/results_exit_heads/attention_adapter_probe.txt

The kept head at exit 15 (docs/smollm2_early_exit.md section 8) is a SwiGLU adapter
h + MLP(norm(h)) in front of the frozen shared final norm + LM head: 26 % teacher-forced
top-1 agreement with the final layer, 16-20 % acceptance in decoding, against the 0.5 the
issue asks. It sees one position. A Kangaroo-style adapter also attends over the context;
here it reads the keys and values the model already cached at its last layer below the exit
(layer index 14), so decoding would need no new cache, only a query and an output projection:

    mlp        h + MLP(norm(h))                                         (the kept kind)
    attn+mlp   a = h + Wo Attn(Wq RoPE(norm'(h)), K_14, V_14); a + MLP(norm(a))

Both train on the same rows with the kept run's recipe and budget (400 ShareGPT training
conversations packed into rows of 256 tokens, 120 steps x 4 rows, cross-entropy on the final
layer's greedy token, AdamW peak 1e-3, 5 warmup steps, cosine to 10 %), from the same seed;
Wo and the MLP's down projection start at zero (each head starts as the shared head). Printed:
teacher-forced top-1 agreement with the final layer on the first 16 held-out ShareGPT rows
(4,096 tokens), every 40 steps. This is not the engine: a head with attention is not
wired into decoding, so no acceptance is measured.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hispec_jax.models.heads import exit_logits
from hispec_jax.models.model import load_model
from hispec_jax.models.pull import pull
from hispec_jax.models.transformer import _project_qkv, apply_rope, rms_norm
from hispec_jax.train_heads.features import base_hidden_states
from hispec_jax.train_heads.rows import sharegpt_rows

EXIT, SEQ, TRAIN_DOCS, EVAL_ROWS = 15, 256, 400, 16
STEPS, BATCH, LR, WARMUP, END_LR = 120, 4, 1e-3, 5, 0.1
FFN = 1536


def features(params, cfg, rows: np.ndarray, batch: int = 8):
    """(h_14 [R, T, D], h_15, layer 14's keys and values [R, T, K, H] each, the final
    layer's greedy tokens [R, T]) of token rows."""
    positions = jnp.broadcast_to(jnp.arange(SEQ, dtype=jnp.int32), (batch, SEQ))

    @jax.jit
    def run(tokens):
        hidden, final = base_hidden_states(params, cfg, tokens, (EXIT - 1, EXIT))
        h14, h15 = hidden[:, 0], hidden[:, 1]
        layer = params["layers"][EXIT - 1]
        normed = rms_norm(h14, layer["attn_norm"], cfg.rms_norm_eps)
        _, k, v = _project_qkv(layer, cfg, normed, positions, jnp.float32)
        return h15, k, v, jnp.argmax(final, -1).astype(jnp.int32)

    out = [[], [], [], []]
    padded = np.concatenate([rows, rows[:(-len(rows)) % batch]])
    for i in range(0, len(padded), batch):
        for acc, x in zip(out, run(jnp.asarray(padded[i:i + batch]))):
            acc.append(np.asarray(x))
    return [np.concatenate(acc)[:len(rows)] for acc in out]


def init_head(cfg, key, attention: bool):
    D, N, H = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    k1, k2, k3 = jax.random.split(key, 3)
    head = {"mlp_norm": jnp.ones(D), "up": jax.random.normal(k1, (D, FFN)) * D**-0.5,
            "gate": jax.random.normal(k2, (D, FFN)) * D**-0.5, "down": jnp.zeros((FFN, D))}
    if attention:
        head |= {"attn_norm": jnp.ones(D), "wq": jax.random.normal(k3, (D, N * H)) * D**-0.5,
                 "wo": jnp.zeros((N * H, D))}
    return head


def apply_head(head, cfg, h_BxTxD, k_BxTxKxH, v_BxTxKxH):
    """The head's hidden state before the shared final norm + LM head."""
    B, T, _ = h_BxTxD.shape
    K, G, H = cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim
    if "wq" in head:
        x = rms_norm(h_BxTxD, head["attn_norm"], cfg.rms_norm_eps)
        q = (x @ head["wq"]).reshape(B, T, K * G, H)
        positions = jnp.broadcast_to(jnp.arange(T), (B, T))
        q = apply_rope(q, positions, jnp.asarray(cfg.inv_freq)).reshape(B, T, K, G, H) * H**-0.5
        scores = jnp.einsum("BTKGH,BSKH->BKGTS", q, k_BxTxKxH)
        causal = jnp.arange(T)[None, :] <= jnp.arange(T)[:, None]
        probs = jax.nn.softmax(jnp.where(causal, scores, -1e30), axis=-1)
        out = jnp.einsum("BKGTS,BSKH->BTKGH", probs, v_BxTxKxH).reshape(B, T, K * G * H)
        h_BxTxD = h_BxTxD + out @ head["wo"]
    x = rms_norm(h_BxTxD, head["mlp_norm"], cfg.rms_norm_eps)
    return h_BxTxD + (jax.nn.silu(x @ head["gate"]) * (x @ head["up"])) @ head["down"]


def cost_layers(cfg, head) -> float:
    """The head's multiply-adds per token before the LM head, in layer equivalents (its
    matrices' sizes over one decoder layer's; attention over the context not counted)."""
    D, F, NH, KH = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim,
                    cfg.num_kv_heads * cfg.head_dim)
    layer = 2 * D * NH + 2 * D * KH + 3 * D * F
    return sum(w.size for w in head.values() if w.ndim == 2) / layer


def train(params, cfg, name, attention, data, held_out, log):
    shared = {"final_norm": params["final_norm"], "embed": params["embed"]}
    head = init_head(cfg, jax.random.PRNGKey(0), attention)
    schedule = optax.warmup_cosine_decay_schedule(0.0, LR, WARMUP, STEPS, LR * END_LR)
    opt = optax.adamw(schedule, weight_decay=0.0)
    state = opt.init(head)

    def logits(head, h, k, v):
        return exit_logits(shared, {}, cfg, apply_head(head, cfg, h, k, v), cfg.num_layers)

    @jax.jit
    def step(head, state, h, k, v, target):
        def loss_fn(head):
            return optax.softmax_cross_entropy_with_integer_labels(
                logits(head, h, k, v), target).mean()
        loss, grads = jax.value_and_grad(loss_fn)(head)
        updates, state = opt.update(grads, state, head)
        return optax.apply_updates(head, updates), state, loss

    @jax.jit
    def agree(head, h, k, v, target):
        return jnp.mean(jnp.argmax(logits(head, h, k, v), -1) == target)

    def evaluate():
        return float(np.mean([agree(head, *(jnp.asarray(x[i:i + BATCH]) for x in held_out))
                              for i in range(0, EVAL_ROWS, BATCH)]))

    log(f"| {name} | {cost_layers(cfg, head):.2f} | step 0: {evaluate():.3f}")
    order = np.random.RandomState(0).permutation(len(data[0]))
    t0 = time.time()
    for s in range(STEPS):
        idx = order[(s * BATCH) % len(order):][:BATCH]
        head, state, loss = step(head, state, *(jnp.asarray(x[idx]) for x in data))
        if (s + 1) % 40 == 0:
            log(f"|   step {s + 1}: loss {float(loss):.3f}, agreement {evaluate():.3f} "
                f"({time.time() - t0:.0f} s)")


def main():
    model = load_model(str(pull("smollm2-135m-instruct")))
    cfg, params = model.cfg, model.params
    rows = sharegpt_rows(model, SEQ, TRAIN_DOCS, EVAL_ROWS, seed=0)
    t0 = time.time()
    data = features(params, cfg, rows.train[:STEPS * BATCH])
    held_out = features(params, cfg, rows.eval)
    print(f"# SmolLM2-135M-Instruct, exit {EXIT}; {rows.source}; {STEPS} steps x {BATCH} rows "
          f"of {SEQ}; held out: {EVAL_ROWS} rows; features {time.time() - t0:.0f} s", flush=True)
    print("# teacher-forced top-1 agreement with the final layer on the held-out rows\n")
    print("| head | cost, layers (before the LM head) | agreement |")
    print("|---|---|---|")
    for name, attention in (("mlp (the kept kind)", False), ("attn+mlp", True)):
        train(params, cfg, name, attention, data, held_out, lambda m: print(m, flush=True))


if __name__ == "__main__":
    main()
