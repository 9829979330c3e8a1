"""Tiny GGUF files written the way llama.cpp's convert_hf_to_gguf.py writes them (no hub).

`write_gguf` takes a transformers model's state dict, renames tensors to GGUF names, permutes
the Q/K rows of `llama` models for llama.cpp's RoPE (exactly `LlamaModel.permute` in
convert_hf_to_gguf.py), quantizes matrices with `gguf.quants.quantize` (1-D norms stay F32,
as llama.cpp keeps them) or fills K-quant blocks with random bytes (gguf-py can dequantize but
not quantize those), and writes architecture, tokenizer and chat-template metadata.
"""

from __future__ import annotations

import json
import math

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CORPUS = ["the cat sat on the mat", "a dog ran and then it was very big",
          "hello world, the small red cat is blue", "What is the capital of France?",
          "Paris is the capital of France.", "user assistant system 0123456789"] * 4


def byte_level_vocab(vocab_size: int = 320):
    """A byte-level BPE (GPT-2 style, `tokenizer.ggml.model = gpt2`) trained on CORPUS:
    (tokens by id, token types, merges); ids 0-2 are SPECIALS (CONTROL)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [3 if t in SPECIALS else 1 for t in tokens]
    return tokens, types, merges


def sentencepiece_vocab():
    """A Llama-2 style vocabulary (`tokenizer.ggml.model = llama`): <unk>, <s>, </s>, 256 byte
    tokens, then every prefix of "▁word" for the corpus words, scored so longer pieces merge
    later. (tokens, types, scores)."""
    tokens, types, scores = ["<unk>", "<s>", "</s>"], [2, 3, 3], [0.0, 0.0, 0.0]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    scores += [0.0] * 256
    pieces: list[str] = []
    words = sorted({w.strip(",.?") for line in CORPUS for w in line.split()})
    for w in words:
        for ch in "▁" + w:
            if ch not in pieces:
                pieces.append(ch)
    for w in words:
        for end in range(2, len(w) + 2):
            if ("▁" + w)[:end] not in pieces:
                pieces.append(("▁" + w)[:end])
    tokens += pieces
    types += [1] * len(pieces)
    scores += [-float(i) for i in range(len(pieces))]
    return tokens, types, scores


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py `LlamaModel.permute` (n_head = kv heads for K)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_freqs(head_dim: int, theta: float, factor: float, low: float = 1.0,
                      high: float = 4.0, old_context_len: int = 8192) -> np.ndarray:
    """convert_hf_to_gguf.py's `rope_freqs` for llama3 RoPE scaling."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_context_len / high:
            out.append(1.0)
        elif wavelen > old_context_len / low:
            out.append(factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf_name: str) -> str:
    if hf_name in _NAMES:
        return _NAMES[hf_name]
    _, _, i, rest = hf_name.split(".", 3)
    return f"blk.{i}.{_NAMES[rest]}"


def random_k_quant_blocks(shape: tuple[int, int], qtype, rng) -> np.ndarray:
    """Random bytes as K-quant blocks, with the float16 super-block scales set to small
    finite values so every weight is finite."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    blocks = rng.integers(0, 256, (rows * cols // block_size, type_size), dtype=np.uint8)
    scale = lambda n: (rng.uniform(2e-4, 1e-3, (blocks.shape[0], n))
                       .astype(np.float16).view(np.uint8))
    if qtype == Q.Q4_K or qtype == Q.Q5_K:   # d, dmin first
        blocks[:, :4] = scale(2)
    elif qtype == Q.Q6_K:                      # d last; int8 sub-scales before it
        blocks[:, -2:] = scale(1)
    else:
        raise ValueError(qtype)
    return blocks.reshape(rows, cols // block_size * type_size)


def write_gguf(path, hf_model, qtype=Q.F32, arch: str = "llama", vocab=None,
               tokenizer_model: str = "gpt2", chat_template: str | None = CHATML,
               eos_token: int = 2, rope_freqs: np.ndarray | None = None,
               extra_tensors: dict | None = None, extra_metadata=None, seed: int = 0) -> None:
    """Writes `hf_model` (a transformers Llama / Qwen3 model) as a GGUF file at `path`.

    vocab: (tokens, types, merges) for tokenizer_model "gpt2", (tokens, types, scores) for
    "llama"; None: no tokenizer metadata. Matrices are stored as `qtype` (K-quants as random
    blocks); `extra_tensors` {name: (array, raw_dtype or None)} are added as they are.
    """
    cfg = hf_model.config
    rng = np.random.default_rng(seed)
    H = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    if arch == "llama":
        w.add_rope_dimension_count(H)
    else:
        w.add_key_length(H)
        w.add_value_length(H)
    w.add_file_type(int(qtype) if qtype != Q.F32 else 0)
    for fn, value in (extra_metadata or {}).items():
        getattr(w, fn)(*value)
    if vocab is not None:
        w.add_tokenizer_model(tokenizer_model)
        tokens, types, third = vocab
        w.add_token_list(tokens)
        w.add_token_types(types)
        if tokenizer_model == "gpt2":
            w.add_tokenizer_pre("smollm")
            w.add_token_merges(third)
            w.add_bos_token_id(1)
            w.add_eos_token_id(eos_token)
            w.add_unk_token_id(0)
            w.add_pad_token_id(eos_token)
            w.add_add_bos_token(False)
        else:
            w.add_token_scores(third)
            w.add_bos_token_id(1)
            w.add_eos_token_id(2)
            w.add_unk_token_id(0)
        if chat_template is not None:
            w.add_chat_template(chat_template)

    for hf_name, tensor in hf_model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        x = tensor.float().numpy()
        if arch == "llama" and hf_name.endswith("q_proj.weight"):
            x = llama_cpp_permute(x, cfg.num_attention_heads)
        elif arch == "llama" and hf_name.endswith("k_proj.weight"):
            x = llama_cpp_permute(x, cfg.num_key_value_heads)
        name = gguf_name(hf_name)
        if x.ndim == 1 or qtype == Q.F32:
            w.add_tensor(name, np.ascontiguousarray(x, np.float32))
        elif qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
            w.add_tensor(name, random_k_quant_blocks(x.shape, qtype, rng), raw_dtype=qtype)
        elif qtype == Q.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    for name, (x, raw_dtype) in (extra_tensors or {}).items():
        w.add_tensor(name, x, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_chat_gguf(path):
    """A 2-layer Llama with tied embeddings, byte-level chat vocab, written as Q4_1 to `path`
    (stands in for `hispec pull smollm2-135m-instruct` in CLI and README tests)."""
    import torch
    import transformers

    vocab = byte_level_vocab()
    torch.manual_seed(0)
    hf_model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(vocab[0]), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.3, tie_word_embeddings=True)).eval()
    write_gguf(path, hf_model, Q.Q4_1, vocab=vocab)
    return path
