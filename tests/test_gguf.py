"""GGUF import against transformers loading the same file (`from_pretrained(gguf_file=...)`),
and against the original weights the file was written from.

The files are tiny models written here by `gguf_files.write_gguf` (llama.cpp's layout: Q/K
rows permuted, quantized matrices, F32 norms, tokenizer and chat-template metadata).
"""

import dataclasses
import re
import shlex
import tracemalloc
from pathlib import Path

import gguf
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers

import gguf_files as gf
import hispec_jax
from hispec_jax.decoding import chat as chat_lib
from hispec_jax.decoding import engine as engine_lib
from hispec_jax.decoding import recommended
from hispec_jax.models import gguf_io, hf_io
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.params import (PROJECTIONS, layer_dict_out_major, param_specs,
                                      to_out_major, with_layer_layout)
from hispec_jax.models.transformer import embed, run_layers_cached

Q = gf.Q
TEXTS = ["hello world, the cat is very big", "What is the capital of France?",
         "  two  spaces\nand a newline <|im_end|> 42"]


def _hf_llama(vocab_size, seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                initializer_range=0.3, tie_word_embeddings=False, rope_theta=10000.0,
                rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    args.update(kw)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**args)).eval()


def _hf_qwen3(vocab_size, seed=1):
    torch.manual_seed(seed)
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, max_position_embeddings=256,
        initializer_range=0.3, tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)).eval()


@pytest.fixture(scope="module")
def vocab():
    return gf.byte_level_vocab()


@pytest.fixture(scope="module")
def hf_models(vocab):
    V = len(vocab[0])
    return {
        "llama": _hf_llama(V),
        "llama_tied": _hf_llama(V, seed=2, tie_word_embeddings=True, num_key_value_heads=4),
        "qwen3": _hf_qwen3(V),
        # K-quants need rows of 256: every matrix input is 256 wide
        "llama_k": _hf_llama(V, seed=3, hidden_size=256, intermediate_size=256,
                             num_hidden_layers=2, initializer_range=0.05),
    }


# name -> (hf model, qtype, arch)
CASES = {
    "llama_f32": ("llama", Q.F32, "llama"),
    "llama_f16": ("llama", Q.F16, "llama"),
    "llama_q8_0": ("llama", Q.Q8_0, "llama"),
    "llama_q4_0": ("llama", Q.Q4_0, "llama"),
    "llama_tied_q4_1": ("llama_tied", Q.Q4_1, "llama"),
    "llama_q4_k": ("llama_k", Q.Q4_K, "llama"),
    "llama_q6_k": ("llama_k", Q.Q6_K, "llama"),
    "qwen3_f32": ("qwen3", Q.F32, "qwen3"),
    "qwen3_q8_0": ("qwen3", Q.Q8_0, "qwen3"),
}


@pytest.fixture(scope="module")
def gguf_paths(tmp_path_factory, hf_models, vocab):
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for name, (model, qtype, arch) in CASES.items():
        out[name] = root / f"{name}.gguf"
        gf.write_gguf(out[name], hf_models[model], qtype, arch=arch, vocab=vocab)
    return out


def _transformers_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def _transformers_tokenizer(path):
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def our_logits(model, tokens_BxT) -> np.ndarray:
    B, T = tokens_BxT.shape
    cache = KVCache.zeros(model.cfg, B, T)
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))
    x, _ = run_layers_cached(model.params, model.cfg, embed(model.params, jnp.asarray(tokens_BxT)),
                             positions, cache, 0, model.cfg.num_layers)
    return np.asarray(exit_logits(model.params, {}, model.cfg, x, model.cfg.num_layers))


def _greedy_hf(hf_model, ids, n):
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n,
                                do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("case", list(CASES))
def test_matches_transformers_gguf_loading(gguf_paths, case):
    """Logits, greedy tokens and tokenization equal transformers' loading of the same file."""
    path = gguf_paths[case]
    model = hispec_jax.load_model(path)
    ref = _transformers_model(path)
    ref_tok = _transformers_tokenizer(path)
    assert model.cfg.tie_word_embeddings == ref.config.tie_word_embeddings
    assert model.cfg.qk_norm == (CASES[case][2] == "qwen3")
    for text in TEXTS:
        assert model.tokenizer(text)["input_ids"] == ref_tok(text)["input_ids"], text
        assert model.tokenizer.decode(ref_tok(text)["input_ids"]) == ref_tok.decode(
            ref_tok(text)["input_ids"])
    ids = model.tokenizer(TEXTS[0])["input_ids"]
    tokens = np.asarray([ids, ids[::-1]])
    with torch.no_grad():
        want = ref(torch.tensor(tokens)).logits.numpy()
    got = our_logits(model, tokens)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, atol=2e-5 * max(scale, 1.0), rtol=0)
    result = hispec_jax.generate(model, [ids], method="ar", max_new_tokens=12, ignore_eos=True)
    assert result.token_ids[0] == _greedy_hf(ref, ids, 12)


@pytest.mark.parametrize("model_name,arch", [("llama", "llama"), ("llama_tied", "llama"),
                                             ("qwen3", "qwen3")])
def test_f32_file_gives_the_original_weights(tmp_path, hf_models, vocab, model_name, arch):
    """An F32 file loads to exactly the weights of the HF model it was written from: llama.cpp's
    Q/K row permutation is undone (llama) and not applied (qwen3)."""
    hf_model = hf_models[model_name]
    gf.write_gguf(tmp_path / "m.gguf", hf_model, Q.F32, arch=arch, vocab=vocab)
    hf_model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    cfg, params, tokenizer, gen = gguf_io.load_checkpoint(tmp_path / "m.gguf")
    hf_cfg, hf_params, _, _ = hf_io.load_checkpoint(tmp_path / "hf")
    assert cfg == hf_cfg.replace(max_position_embeddings=cfg.max_position_embeddings)
    for key in ("embed", "final_norm", *(["lm_head"] if not cfg.tie_word_embeddings else [])):
        np.testing.assert_array_equal(params[key], hf_params[key], err_msg=key)
    for key in param_specs(cfg)["layers"]:
        np.testing.assert_array_equal(params["layers"][key], hf_params["layers"][key], err_msg=key)
    assert gen == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    assert tokenizer.bos_token == "<|im_start|>" and tokenizer.eos_token == "<|im_end|>"


def test_llama3_rope_freqs(tmp_path, vocab):
    """Llama 3.1 files carry `rope_freqs.weight` instead of rope_scaling parameters."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    hf_model = _hf_llama(len(vocab[0]), seed=4, hidden_size=64, num_attention_heads=4,
                         rope_theta=500000.0, rope_scaling=dict(scaling))
    head_dim = 16
    gf.write_gguf(tmp_path / "l3.gguf", hf_model, Q.F32, vocab=vocab,
                  rope_freqs=gf.llama3_rope_freqs(head_dim, 500000.0, 8.0))
    model = hispec_jax.load_model(tmp_path / "l3.gguf")
    assert model.cfg.rope_scaling_dict == scaling
    ids = model.tokenizer(TEXTS[1])["input_ids"]
    with torch.no_grad():
        want = hf_model(torch.tensor([ids])).logits.numpy()
    np.testing.assert_allclose(our_logits(model, np.asarray([ids])), want, atol=1e-4, rtol=0)

    gf.write_gguf(tmp_path / "other.gguf", hf_model, Q.F32, vocab=vocab,
                  rope_freqs=gf.llama3_rope_freqs(head_dim, 500000.0, 8.0, low=2.0))
    with pytest.raises(ValueError, match="'rope_freqs.weight' is not llama3 RoPE scaling"):
        hispec_jax.load_model(tmp_path / "other.gguf")


def test_layouts_and_bfloat16(gguf_paths):
    path = gguf_paths["llama_q4_0"]
    scan = hispec_jax.load_model(path, layer_layout="scan")
    unrolled = hispec_jax.load_model(path, layer_layout="unrolled", out_major=True)
    bf16 = hispec_jax.load_model(path, dtype="bfloat16", layer_layout="scan")
    canonical = hispec_jax.load_model(path, layer_layout="unrolled")  # the default order
    for om in (False, True):  # fused while loading: the fused layout of the same weights
        fused = hispec_jax.load_model(path, layer_layout="unrolled", out_major=om, fused=True)
        want = with_layer_layout(scan.params, "unrolled", out_major=om, fused=True)
        jax.tree.map(np.testing.assert_array_equal, fused.params, want)
    # int8 while loading: the int8 layout of the same weights (NumPy's division on the host
    # may put a scale an ulp from XLA's)
    int8 = hispec_jax.load_model(path, layer_layout="unrolled", fused=True, quantize="int8")
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=0), int8.params,
                 with_layer_layout(scan.params, "unrolled", fused=True, int8=True))
    assert isinstance(unrolled.params["layers"], tuple) and bf16.cfg.dtype == "bfloat16"
    # out-major: the projections [out..., in...]
    assert set(unrolled.params["layers"][0]) == {
        k + "_T" if k in PROJECTIONS else k for k in scan.params["layers"]}
    assert not any(k.endswith("_T") for k in canonical.params["layers"][0])
    for key, stacked in scan.params["layers"].items():
        assert stacked.dtype == jnp.float32
        for i, layer in enumerate(unrolled.params["layers"]):
            np.testing.assert_array_equal(layer_dict_out_major(layer, False)[key], stacked[i],
                                          err_msg=key)
            np.testing.assert_array_equal(canonical.params["layers"][i][key], stacked[i],
                                          err_msg=key)
            if key in PROJECTIONS:
                np.testing.assert_array_equal(layer[key + "_T"], to_out_major(key, stacked[i]))
        assert bf16.params["layers"][key].dtype == jnp.bfloat16
        np.testing.assert_array_equal(bf16.params["layers"][key],
                                      np.asarray(stacked).astype(ml_dtypes.bfloat16), err_msg=key)


def test_hispec_equals_ar(gguf_paths):
    model = hispec_jax.load_model(gguf_paths["llama_tied_q4_1"])
    prompts = TEXTS[:2]
    ar = hispec_jax.generate(model, prompts, method="ar", max_new_tokens=16, ignore_eos=True)
    out = hispec_jax.generate(model, prompts, method="hispec", draft_exit=1, verify_exits=(2,),
                              max_new_tokens=16, ignore_eos=True)
    assert out.token_ids == ar.token_ids


@pytest.mark.parametrize("layout", ["scan", "unrolled"])
def test_loading_needs_no_second_copy(tmp_path, vocab, monkeypatch, layout):
    """Host (numpy) memory while loading: the weights once, in float32, plus temporaries of
    about one tensor (dequantization runs in chunks, small here as in a large model)."""
    hf_model = _hf_llama(len(vocab[0]), seed=6, hidden_size=256, intermediate_size=256,
                         num_hidden_layers=6)
    gf.write_gguf(tmp_path / "m.gguf", hf_model, Q.Q8_0, vocab=vocab)
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    cfg = gguf_io.config_from_metadata(reader)
    specs = jax.tree.leaves(param_specs(cfg), is_leaf=lambda s: hasattr(s, "axes"))
    total = sum(int(np.prod(s.shape)) * 4 for s in specs)
    tensor = 256 * 256 * 4  # the largest per-layer matrix
    monkeypatch.setattr(gguf_io, "_CHUNK_ELEMENTS", 1 << 14)
    tracemalloc.start()
    params = gguf_io.load_weights(reader, cfg, layout)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert jax.tree.leaves(params)[0].dtype == jnp.float32
    assert peak < total + 3 * tensor, (peak, total)
    # On CPU the aligned host buffers become the device arrays (no copy at all).
    if jax.default_backend() == "cpu":
        assert current > 0.9 * total, (current, total)


# ----- errors -----------------------------------------------------------------------------

def _write_raw_type(path, hf_model, vocab):
    """F32 except `blk.1.ffn_up.weight`, stored as Q8_1 blocks (gguf-py cannot dequantize)."""
    name = "model.layers.1.mlp.up_proj.weight"
    rows, cols = hf_model.state_dict()[name].shape
    block, size = gguf.GGML_QUANT_SIZES[Q.Q8_1]
    blocks = np.random.default_rng(0).integers(0, 256, (rows, cols // block * size), np.uint8)
    gf.write_gguf(path, _Without(hf_model, name), Q.F32, vocab=vocab,
                  extra_tensors={"blk.1.ffn_up.weight": (blocks, Q.Q8_1)})


def _write(**kwargs):
    return lambda path, hf_model, vocab: gf.write_gguf(path, hf_model, Q.F32, vocab=vocab, **kwargs)


def _f32(*shape):
    return np.ones(shape, np.float32), None


ERRORS = {
    "architecture": (_write(arch="gpt2"), "GGUF architecture 'gpt2' is not supported"),
    "tensor_type": (_write_raw_type, "'blk.1.ffn_up.weight' has type Q8_1, which gguf.quants "
                                     "cannot dequantize"),
    "unknown_tensor": (_write(extra_tensors={"blk.0.attn_gate.weight": _f32(64, 64)}),
                       "unknown GGUF tensor 'blk.0.attn_gate.weight'"),
    "bias": (_write(extra_tensors={"blk.0.attn_q.bias": _f32(64)}),
             "GGUF tensor 'blk.0.attn_q.bias': biases are not supported"),
    "layer_out_of_range": (_write(extra_tensors={"blk.3.ffn_norm.weight": _f32(64)}),
                           "'blk.3.ffn_norm.weight': layer 3 >= block_count=3"),
    "yarn": (_write(extra_metadata={"add_rope_scaling_type": (gguf.RopeScalingType.YARN,)}),
             "rope.scaling.type='yarn' is not supported"),
    "moe": (_write(extra_metadata={"add_expert_count": (4,)}), "llama.expert_count=4"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_files_raise_naming_the_problem(tmp_path, hf_models, vocab, case):
    write, message = ERRORS[case]
    write(tmp_path / "bad.gguf", hf_models["llama"], vocab)
    with pytest.raises(ValueError, match=re.escape(message)):
        hispec_jax.load_model(tmp_path / "bad.gguf")


class _Without:
    """`hf_model` whose state dict lacks `name`."""

    def __init__(self, hf_model, name):
        self.config, self._model, self._name = hf_model.config, hf_model, name

    def state_dict(self):
        return {k: v for k, v in self._model.state_dict().items() if k != self._name}


def test_missing_tensor(tmp_path, hf_models, vocab):
    path = tmp_path / "m.gguf"
    gf.write_gguf(path, _Without(hf_models["llama"], "model.layers.2.self_attn.v_proj.weight"),
                  Q.F32, vocab=vocab)
    with pytest.raises(ValueError, match=re.escape("missing GGUF tensor 'blk.2.attn_v.weight'")):
        hispec_jax.load_model(path)


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(ValueError, match="no such GGUF file"):
        hispec_jax.load_model(tmp_path / "absent.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        hispec_jax.load_model(tmp_path / "junk.gguf")


def test_sentencepiece_tokenizer(tmp_path, hf_models):
    """A Llama-2 style (tokenizer.ggml.model = llama) vocabulary: same ids as transformers,
    BOS added by default."""
    tokens, types, scores = gf.sentencepiece_vocab()
    hf_model = _hf_llama(len(tokens), seed=5)
    path = tmp_path / "spm.gguf"
    gf.write_gguf(path, hf_model, Q.Q8_0, vocab=(tokens, types, scores), tokenizer_model="llama",
                  chat_template=None)
    model = hispec_jax.load_model(path)
    ref_tok = _transformers_tokenizer(path)
    for text in ["the cat sat on the mat", "hello world", "Paris? xyz \u00e9"]:
        ids = model.tokenizer(text)["input_ids"]
        assert ids == ref_tok(text)["input_ids"] and ids[0] == 1, text
    ids = model.tokenizer("the cat sat")["input_ids"]
    assert hispec_jax.generate(model, [ids], method="ar",
                               max_new_tokens=8, ignore_eos=True).token_ids[0] == \
        _greedy_hf(_transformers_model(path), ids, 8)


# ----- chat -------------------------------------------------------------------------------

def test_chat_prompt_matches_transformers(gguf_paths):
    path = gguf_paths["llama_tied_q4_1"]
    model = hispec_jax.load_model(path)
    ref_tok = _transformers_tokenizer(path)
    assert model.tokenizer.chat_template == gf.CHATML
    conversation = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "What is the capital of France?"}]
    for prompt, messages in (("What is the capital of France?",
                              [{"role": "user", "content": "What is the capital of France?"}]),
                             (conversation, conversation)):
        text = ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert chat_lib.chat_prompt_ids(model, [prompt]) == [
            ref_tok(text, add_special_tokens=False)["input_ids"]]
    assert chat_lib.end_of_turn_ids(model) == (2,)


def test_chat_stops_at_end_of_turn(tmp_path, hf_models, vocab):
    """EOS is <|endoftext|> (0); with chat=True generation also stops at <|im_end|> (2)."""
    path = tmp_path / "chat.gguf"
    gf.write_gguf(path, hf_models["llama"], Q.F32, vocab=vocab, eos_token=0)
    model = hispec_jax.load_model(path)
    assert model.eos_token_ids == (0,)
    prompt_ids = chat_lib.chat_prompt_ids(model, "hello world")
    plain = hispec_jax.generate(model, prompt_ids, method="ar", max_new_tokens=24, ignore_eos=True)
    # Make <|im_end|> the model's favourite wherever its most frequent token wins:
    favourite = max(set(plain.token_ids[0]), key=plain.token_ids[0].count)
    head = model.params["lm_head"]
    model = dataclasses.replace(model, params={**model.params, "lm_head": head.at[:, 2].set(
        2.0 * head[:, favourite])})
    plain = hispec_jax.generate(model, prompt_ids, method="ar",
                                max_new_tokens=24, ignore_eos=True).token_ids[0]
    assert 2 in plain and plain.index(2) < 23
    stop = min(plain.index(t) for t in (0, 2) if t in plain)
    chat = hispec_jax.generate(model, "hello world", method="ar", chat=True, max_new_tokens=24)
    assert chat.prompt_token_ids == prompt_ids
    assert chat.token_ids[0] == plain[:stop + 1]
    assert chat.texts[0] == model.tokenizer.decode(plain[:stop], skip_special_tokens=True)
    no_chat = hispec_jax.generate(model, prompt_ids, method="ar", max_new_tokens=24)
    assert len(no_chat.token_ids[0]) > stop + 1 or plain[stop] == 0


def test_chat_errors(gguf_paths, tmp_path, hf_models, vocab):
    model = hispec_jax.load_model(gguf_paths["llama_tied_q4_1"])
    before = engine_lib.compilations
    with pytest.raises(ValueError, match=r"prompts\[0\].*chat=True"):
        hispec_jax.generate(model, [[5, 6, 7]], method="ar", chat=True)
    with pytest.raises(ValueError, match="needs 'role' and 'content'"):
        hispec_jax.generate(model, [[{"role": "user"}]], method="ar", chat=True)
    path = tmp_path / "no_template.gguf"
    gf.write_gguf(path, hf_models["llama"], Q.F32, vocab=vocab, chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        hispec_jax.generate(hispec_jax.load_model(path), "hi", method="ar", chat=True)
    with pytest.raises(ValueError, match="no tokenizer"):
        hispec_jax.generate(dataclasses.replace(model, tokenizer=None), "hi", method="ar",
                            chat=True)
    assert engine_lib.compilations == before


# ----- the real SmolLM2 file (`hispec pull smollm2-135m-instruct`: conftest.smollm2_path) ----

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_smollm2_transcript():
    """(prompts, max_new_tokens, printed continuation, token count, method) of README's
    SmolLM2 transcript: the `hispec generate --model "$M" --chat` command (no --method: the
    model's default plan, named on the `plan:` line), its stdout, and the count and method
    in its summary line."""
    text = README.read_text()
    block = text[text.index("$ M=$(hispec pull smollm2-135m-instruct)"):]
    block = block[:block.index("```")]
    lines = block.splitlines()
    argv = shlex.split(lines[1].removeprefix("$ "))
    assert argv[:5] == ["hispec", "generate", "--model", "$M", "--chat"], argv
    assert argv[5] == "--max-new-tokens"
    plan = re.match(r"plan: (\w+) \(", lines[2])
    summary = next(i for i, line in enumerate(lines) if re.match(r"\[\w+\] ", line))
    method = re.match(r"\[(\w+)\] ", lines[summary]).group(1)
    assert plan and plan.group(1) == method, (lines[2], lines[summary])
    tokens = int(re.search(r": (\d+) tokens, ", lines[summary]).group(1))
    stdout = "\n".join(lines[3:summary]) + "\n"
    return argv[7:], int(argv[6]), stdout, tokens, method


@pytest.fixture(scope="module")
def smollm2_readme_run(smollm2_path):
    """The model, and README's transcript command run in-process (one compile): greedy AR,
    the chat template, both prompts in one batch as `hispec generate` runs them."""
    model = hispec_jax.load_model(smollm2_path)
    prompts, max_new_tokens, _, _, _ = readme_smollm2_transcript()
    return model, hispec_jax.generate(model, prompts, method="ar",
                                      chat=True, max_new_tokens=max_new_tokens)


def test_smollm2_chat_answer(smollm2_path, smollm2_readme_run):
    """The real model: its config, a correct chat answer that stops at <|im_end|>, and its
    tokens equal transformers' greedy choices on the same file (one teacher-forced pass)."""
    model, result = smollm2_readme_run
    cfg = model.cfg
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
            cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size, cfg.rope_theta,
            cfg.tie_word_embeddings) == (30, 576, 1536, 9, 3, 64, 49152, 1e5, True)
    assert result.prompt_token_ids[0] == chat_lib.chat_prompt_ids(
        model, ["What is the capital of France?"])[0]
    assert "Paris" in result.texts[0]
    assert result.token_ids[0][-1] == model.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ref = _transformers_model(smollm2_path)
    for prompt_ids, new_ids in zip(result.prompt_token_ids, result.token_ids):
        with torch.no_grad():
            logits = ref(torch.tensor([prompt_ids + new_ids[:-1]])).logits[0].numpy()
        assert logits[len(prompt_ids) - 1:].argmax(-1).tolist() == new_ids


def test_smollm2_head_weighs_eight_layers(smollm2_readme_run):
    """README / docs: SmolLM2-135M's LM head (D x V = 576 x 49,152) weighs 8 of its layers,
    which is what makes draft vocabularies pay on it."""
    from hispec_jax.bench import oracle

    model, _ = smollm2_readme_run
    assert oracle.head_cost_in_layers(model, 15) == pytest.approx(8.0, abs=0.05)


def test_readme_smollm2_transcript(smollm2_path, smollm2_readme_run):
    """README's SmolLM2 transcript is what the command prints today: the model's default
    plan (`hispec generate` without --method), each prompt, its continuation and a blank
    line (`hispec generate --chat`), and the summary's token count. Greedy output is the
    same whatever the method, so the fixture's AR run stands in for the plan's."""
    _, result = smollm2_readme_run
    prompts, _, stdout, tokens, method = readme_smollm2_transcript()
    assert recommended.default_plan_for(smollm2_path, 30)[0] == method
    assert "".join(f"{p}\n{t}\n\n" for p, t in zip(prompts, result.texts)) == stdout
    assert result.stats["new_tokens"] == tokens


def test_loading_does_not_import_torch(gguf_paths):
    """GGUF import (weights, config, tokenizer) runs without torch."""
    import subprocess
    import sys

    code = ("import sys, hispec_jax; m = hispec_jax.load_model(sys.argv[1]); "
            "assert m.tokenizer is not None; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(gguf_paths["llama_q4_0"])],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
