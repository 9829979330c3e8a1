"""HF checkpoint import / export against transformers' own save_pretrained / from_pretrained."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from hispec_jax.models import hf_io
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.params import head_specs, init_from_specs

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=128)
HF_MODELS = {
    "llama_gqa": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **TINY, num_key_value_heads=2, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "llama_mha": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **TINY, num_key_value_heads=4, tie_word_embeddings=False, rope_theta=500000.0)),
    "qwen3_tied": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **TINY, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)),
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """name -> (directory written by save_pretrained, the torch model)."""
    out = {}
    for k, (name, make) in enumerate(HF_MODELS.items()):
        torch.manual_seed(k)
        model = make().eval()
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path, safe_serialization=True)
        out[name] = (path, model)
    return out


def expected_params(sd, cfg: ModelConfig):
    """Our layout computed directly from a HF state dict (the transforms of the spec)."""
    t = {k: v.float().numpy() for k, v in sd.items()}
    D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    per_layer = {
        "attn_norm": lambda p: t[p + "input_layernorm.weight"],
        "wq": lambda p: t[p + "self_attn.q_proj.weight"].T.reshape(D, N, H),
        "wk": lambda p: t[p + "self_attn.k_proj.weight"].T.reshape(D, K, H),
        "wv": lambda p: t[p + "self_attn.v_proj.weight"].T.reshape(D, K, H),
        "wo": lambda p: t[p + "self_attn.o_proj.weight"].T.reshape(N, H, D),
        "mlp_norm": lambda p: t[p + "post_attention_layernorm.weight"],
        "w_gate": lambda p: t[p + "mlp.gate_proj.weight"].T,
        "w_up": lambda p: t[p + "mlp.up_proj.weight"].T,
        "w_down": lambda p: t[p + "mlp.down_proj.weight"].T,
    }
    if cfg.qk_norm:
        per_layer["q_norm"] = lambda p: t[p + "self_attn.q_norm.weight"]
        per_layer["k_norm"] = lambda p: t[p + "self_attn.k_norm.weight"]
    out = {"embed": t["model.embed_tokens.weight"], "final_norm": t["model.norm.weight"],
           "layers": {k: np.stack([f(f"model.layers.{i}.") for i in range(cfg.num_layers)])
                      for k, f in per_layer.items()}}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = t["lm_head.weight"].T
    return out


def assert_tree_equal(got, want):
    assert set(got) == set(want)
    for k in want:
        if isinstance(want[k], dict):
            assert_tree_equal(got[k], want[k])
        else:
            np.testing.assert_array_equal(np.asarray(got[k], np.float32), want[k], err_msg=k)


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_load_matches_hf(hf_dirs, name):
    path, model = hf_dirs[name]
    cfg, params, heads, gen = hf_io.load_checkpoint(path)
    hf = model.config
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim)
    assert cfg.tie_word_embeddings == hf.tie_word_embeddings and cfg.qk_norm == (name == "qwen3_tied")
    assert cfg.rope_theta == hf.rope_parameters["rope_theta"] and cfg.dtype == "float32"
    if name == "llama_gqa":
        assert cfg.rope_scaling_dict["rope_type"] == "llama3" and cfg.rope_scaling_dict["factor"] == 8.0
    else:
        assert cfg.rope_scaling is None
    assert all(v.dtype == jnp.float32 for v in [params["embed"], *params["layers"].values()])
    assert_tree_equal(params, expected_params(model.state_dict(), cfg))
    assert heads == {}
    assert gen == json.loads((path / "generation_config.json").read_text())


def test_load_dtype_bfloat16(tmp_path):
    torch.manual_seed(0)
    model = HF_MODELS["qwen3_tied"]().to(torch.bfloat16)
    model.save_pretrained(tmp_path, safe_serialization=True)
    cfg, params, _, _ = hf_io.load_checkpoint(tmp_path)
    assert cfg.dtype == "bfloat16" and params["layers"]["wq"].dtype == jnp.bfloat16
    assert_tree_equal(params, expected_params(model.state_dict(), cfg))
    cfg32, params32, _, _ = hf_io.load_checkpoint(tmp_path, dtype="float32")
    assert cfg32.dtype == "float32" and params32["embed"].dtype == jnp.float32
    assert_tree_equal(params32, expected_params(model.state_dict(), cfg32))
    out = tmp_path / "export"
    hf_io.save_checkpoint(out, cfg, params)
    with safetensors.safe_open(out / "model.safetensors", framework="np") as f:
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"
    got, want = _load_hf(out).state_dict(), model.state_dict()
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k].float(), want[k].float(), rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("name,dtype", [("llama_gqa", None), ("qwen3_tied", "bfloat16")])
def test_lazy_weights_read_only_what_is_indexed(hf_dirs, name, dtype):
    """`lazy=True` (what a mesh loads through): every slice a shard can ask for equals the
    eagerly loaded array's, in the requested dtype, reading only its bytes (an index that
    is not one rectangle of the HF tensor, half a head_dim, reads the whole tensor)."""
    from hispec_jax.models import lazy_weights

    path, _ = hf_dirs[name]
    _, eager, _, _ = hf_io.load_checkpoint(path, dtype=dtype, host=True)
    before = lazy_weights.bytes_read
    cfg, lazy, _, _ = hf_io.load_checkpoint(path, dtype=dtype, host=True, lazy=True)
    assert lazy_weights.bytes_read == before  # checked, not read
    assert isinstance(lazy["layers"]["wq"], lazy_weights.LazyStack)
    for key, want in [*((k, v) for k, v in eager["layers"].items()), ("embed", eager["embed"])]:
        got = lazy["layers"][key] if key in eager["layers"] else lazy[key]
        assert got.shape == want.shape and got.dtype == want.dtype, key
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=key)
        halves = [tuple(slice(0, n // 2) if a == axis else slice(None)
                        for a, n in enumerate(want.shape)) for axis in range(want.ndim)]
        for index in halves + [(1,)]:
            lazy_weights.bytes_read = 0
            part = got[index]
            np.testing.assert_array_equal(part, want[index], err_msg=f"{key}{index}")
            # float32 on disk; the leading two axes (a layer; a projection's input or a
            # tensor's first axis) always map to one rectangle: only the part is read
            assert lazy_weights.bytes_read >= part.size * 4, (key, index)
            if index == (1,) or index == halves[min(1, want.ndim - 1)]:
                assert lazy_weights.bytes_read == part.size * 4, (key, index)
    with pytest.raises(ValueError, match="host=True"):
        hf_io.load_checkpoint(path, lazy=True)


def _load_hf(path):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_export_round_trip(hf_dirs, tmp_path, name):
    path, model = hf_dirs[name]
    cfg, params, _, gen = hf_io.load_checkpoint(path)
    hf_io.save_checkpoint(tmp_path, cfg, params, generation_config=gen)
    with safetensors.safe_open(tmp_path / "model.safetensors", framework="np") as f:
        assert f.metadata()["format"] == "pt"
        assert ("lm_head.weight" in f.keys()) == (not cfg.tie_word_embeddings)
    reloaded = _load_hf(tmp_path)
    want = model.state_dict()
    got = reloaded.state_dict()
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)
    ids = torch.arange(20).reshape(2, 10) % TINY["vocab_size"]
    with torch.no_grad():  # same config too: rope scaling, eps, theta
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert hf_io.load_checkpoint(tmp_path)[0] == cfg
    assert json.loads((tmp_path / "generation_config.json").read_text()) == gen


def test_load_hf_sharded(hf_dirs, tmp_path):
    path, model = hf_dirs["llama_gqa"]
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="8KB")
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 2
    cfg, params, _, _ = hf_io.load_checkpoint(tmp_path)
    assert_tree_equal(params, expected_params(model.state_dict(), cfg))


def test_sharded_round_trip(hf_dirs, tmp_path):
    cfg, params, _, _ = hf_io.load_checkpoint(hf_dirs["llama_gqa"][0])
    hf_io.save_checkpoint(tmp_path, cfg, params, max_shard_bytes=8192)
    assert not (tmp_path / "model.safetensors").exists()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 2 and all((tmp_path / s).exists() for s in shards)
    cfg2, params2, _, gen = hf_io.load_checkpoint(tmp_path)
    assert cfg2 == cfg and gen == {}
    assert_tree_equal(params2, params)
    _load_hf(tmp_path)
    # Saving again unsharded removes the stale shards and index.
    hf_io.save_checkpoint(tmp_path, cfg, params)
    assert not list(tmp_path.glob("model-*"))
    assert not (tmp_path / "model.safetensors.index.json").exists()
    assert_tree_equal(hf_io.load_checkpoint(tmp_path)[1], params)


def _random_heads(cfg, ranks):
    return {str(e): init_from_specs(head_specs(cfg, r), jax.random.key(e), jnp.float32, 1.0)
            for e, r in ranks.items()}


@pytest.mark.parametrize("ranks", [{1: None, 2: None}, {1: 4, 2: 8}, {2: None, 1: 3}])
def test_exit_heads_round_trip(hf_dirs, tmp_path, ranks):
    cfg, params, _, gen = hf_io.load_checkpoint(hf_dirs["qwen3_tied"][0])
    heads = _random_heads(cfg, ranks)
    hf_io.save_exit_heads(tmp_path, cfg, heads)
    with safetensors.safe_open(tmp_path / hf_io.HEADS_FILENAME, framework="np") as f:
        assert f.metadata() == {"format": "pt", "exit_layers": "1,2"}
        assert f.get_tensor("exit_heads.1.norm.weight").shape == (cfg.hidden_size,)
        if ranks[1] is None:  # HF Linear orientation [out, in]
            np.testing.assert_array_equal(f.get_tensor("exit_heads.1.proj.weight"),
                                          np.asarray(heads["1"]["proj"]).T)
        else:
            assert f.get_tensor("exit_heads.1.proj_down.weight").shape == (ranks[1], cfg.hidden_size)
            assert f.get_tensor("exit_heads.1.proj_up.weight").shape == (cfg.vocab_size, ranks[1])
    loaded = hf_io.load_exit_heads(tmp_path, cfg)
    assert list(loaded) == ["1", "2"]
    assert_tree_equal(loaded, heads)
    # Through the whole checkpoint too; the model still loads in transformers beside the heads.
    out = tmp_path / "ckpt"
    hf_io.save_checkpoint(out, cfg, params, heads=heads, generation_config=gen)
    assert_tree_equal(hf_io.load_checkpoint(out)[2], heads)
    _load_hf(out)


def test_load_exit_heads_absent(hf_dirs):
    path = hf_dirs["llama_mha"][0]
    assert hf_io.load_exit_heads(path, hf_io.load_checkpoint(path)[0]) == {}


# ----- errors ---------------------------------------------------------------------------

@pytest.fixture
def broken(hf_dirs, tmp_path):
    """Writes a copy of the tiny Llama checkpoint after `edit(tensors, config)` to tmp_path."""
    src = hf_dirs["llama_mha"][0]
    tensors = safetensors.numpy.load_file(src / "model.safetensors")
    config = json.loads((src / "config.json").read_text())

    def write(edit=None, files=("model.safetensors",)):
        if edit:
            edit(tensors, config)
        (tmp_path / "config.json").write_text(json.dumps(config))
        for f in files:
            safetensors.numpy.save_file(tensors, tmp_path / f, metadata={"format": "pt"})
        return tmp_path
    return write


def _ones(shape):
    return np.ones(shape, np.float32)


ERROR_CASES = {
    "unknown": (lambda t, c: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": _ones(4)}),
                "unknown tensor 'model.layers.0.self_attn.rotary_emb.inv_freq'"),
    "qk_norm_in_llama": (lambda t, c: t.update({"model.layers.0.self_attn.q_norm.weight": _ones(8)}),
                         "unknown tensor 'model.layers.0.self_attn.q_norm.weight'"),
    "missing": (lambda t, c: t.pop("model.layers.1.mlp.up_proj.weight"),
                "missing tensor 'model.layers.1.mlp.up_proj.weight'"),
    "missing_lm_head": (lambda t, c: t.pop("lm_head.weight"), "missing tensor 'lm_head.weight'"),
    "misshaped": (lambda t, c: t.update({"model.layers.0.self_attn.q_proj.weight": _ones((32, 31))}),
                  "tensor 'model.layers.0.self_attn.q_proj.weight' has shape (32, 31), "
                  "expected (32, 32)"),
    "layer_out_of_range": (lambda t, c: t.update({"model.layers.2.input_layernorm.weight": _ones(32)}),
                           "tensor 'model.layers.2.input_layernorm.weight': layer 2 >= num_layers=2"),
    "model_type": (lambda t, c: c.update(model_type="mistral"), "model_type='mistral'"),
    "tied_head_differs": (lambda t, c: c.update(tie_word_embeddings=True),
                          "tensor 'lm_head.weight' differs from 'model.embed_tokens.weight'"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_load_errors(broken, case):
    edit, message = ERROR_CASES[case]
    with pytest.raises(ValueError, match=re.escape(message)):
        hf_io.load_checkpoint(broken(edit))


def test_tied_head_equal_to_embed_is_accepted(broken):
    def edit(t, c):
        c.update(tie_word_embeddings=True)
        t["lm_head.weight"] = t["model.embed_tokens.weight"].copy()
    cfg, params, _, _ = hf_io.load_checkpoint(broken(edit))
    assert cfg.tie_word_embeddings and "lm_head" not in params


def test_duplicate_across_shards(broken):
    path = broken(files=("a.safetensors",))
    tensors = safetensors.numpy.load_file(path / "a.safetensors")
    safetensors.numpy.save_file({"model.norm.weight": tensors["model.norm.weight"]},
                                path / "b.safetensors", metadata={"format": "pt"})
    weight_map = {**dict.fromkeys(tensors, "a.safetensors"), "model.norm.weight": "b.safetensors"}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    message = "duplicate tensor 'model.norm.weight' in a.safetensors and b.safetensors"
    with pytest.raises(ValueError, match=re.escape(message)):
        hf_io.load_checkpoint(path)


def test_index_names_missing_shard(broken):
    path = broken(files=("a.safetensors",))
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "a.safetensors", "lm_head.weight": "gone.safetensors"}}))
    with pytest.raises(ValueError, match="shard 'gone.safetensors'"):
        hf_io.load_checkpoint(path)


def test_missing_files(broken, tmp_path):
    with pytest.raises(ValueError, match="missing config.json"):
        hf_io.load_checkpoint(tmp_path / "nowhere")
    path = broken(files=())
    with pytest.raises(ValueError, match="no weight files"):
        hf_io.load_checkpoint(path)
    (path / "pytorch_model.bin").write_bytes(b"never unpickled")
    with pytest.raises(ValueError, match="only safetensors .* 'pytorch_model.bin'"):
        hf_io.load_checkpoint(path)


def _head_file(tmp_path, tensors, metadata=None):
    safetensors.numpy.save_file(tensors, tmp_path / hf_io.HEADS_FILENAME,
                                metadata={"format": "pt", **(metadata or {})})


HEAD_ERRORS = {
    "unknown": ({"exit_heads.1.norm.bias": (32,)}, "unknown tensor 'exit_heads.1.norm.bias'"),
    "layer_out_of_range": ({"exit_heads.3.norm.weight": (32,), "exit_heads.3.proj.weight": (64, 32)},
                           "tensor 'exit_heads.3.norm.weight': exit layer '3' must be"),
    "layer_zero": ({"exit_heads.0.norm.weight": (32,)},
                   "tensor 'exit_heads.0.norm.weight': exit layer"),
    "misshaped": ({"exit_heads.1.norm.weight": (32,), "exit_heads.1.proj.weight": (32, 64)},
                  "tensor 'exit_heads.1.proj.weight' has shape (32, 64), expected (64, 32)"),
    "low_rank_mismatch": ({"exit_heads.2.norm.weight": (32,), "exit_heads.2.proj_down.weight": (4, 32),
                           "exit_heads.2.proj_up.weight": (64, 5)},
                          "tensor 'exit_heads.2.proj_up.weight' has shape (64, 5), expected (64, 4)"),
    "missing_proj": ({"exit_heads.1.norm.weight": (32,)}, "missing tensor 'exit_heads.1.proj.weight'"),
    "missing_up": ({"exit_heads.1.norm.weight": (32,), "exit_heads.1.proj_down.weight": (4, 32)},
                   "missing tensor 'exit_heads.1.proj_up.weight'"),
    "full_and_low_rank": ({"exit_heads.1.norm.weight": (32,), "exit_heads.1.proj.weight": (64, 32),
                           "exit_heads.1.proj_down.weight": (4, 32)},
                          "unexpected tensor 'exit_heads.1.proj_down.weight'"),
}


@pytest.mark.parametrize("case", list(HEAD_ERRORS))
def test_exit_head_errors(hf_dirs, tmp_path, case):
    shapes, message = HEAD_ERRORS[case]
    cfg = hf_io.load_checkpoint(hf_dirs["llama_mha"][0])[0]
    _head_file(tmp_path, {k: np.ones(s, np.float32) for k, s in shapes.items()})
    with pytest.raises(ValueError, match=re.escape(message)):
        hf_io.load_exit_heads(tmp_path, cfg)


def test_exit_head_metadata_mismatch(hf_dirs, tmp_path):
    cfg = hf_io.load_checkpoint(hf_dirs["llama_mha"][0])[0]
    _head_file(tmp_path, {"exit_heads.1.norm.weight": np.ones(32, np.float32),
                          "exit_heads.1.proj.weight": np.ones((64, 32), np.float32)},
               metadata={"exit_layers": "1,2"})
    with pytest.raises(ValueError, match="exit_layers='1,2'"):
        hf_io.load_exit_heads(tmp_path, cfg)


def test_save_exit_heads_errors(hf_dirs, tmp_path):
    cfg = hf_io.load_checkpoint(hf_dirs["llama_mha"][0])[0]
    heads = _random_heads(cfg, {1: None})
    with pytest.raises(ValueError, match="exit head '0'.*exit layer '0'"):
        hf_io.save_exit_heads(tmp_path, cfg, {"0": heads["1"]})
    with pytest.raises(ValueError, match="exit head '1'.*'proj'"):
        hf_io.save_exit_heads(tmp_path, cfg, {"1": {**heads["1"], "proj": jnp.ones((32, 63))}})


@pytest.mark.parametrize("layout", ["scan", "unrolled"])
def test_save_model_from_either_layer_layout(hf_dirs, tmp_path, layout):
    from hispec_jax.models.model import load_model, save_model

    path, _ = hf_dirs["llama_gqa"]
    model = load_model(path, layer_layout=layout)
    assert isinstance(model.params["layers"], tuple) == (layout == "unrolled")
    save_model(model, tmp_path)
    assert_tree_equal(hf_io.load_checkpoint(tmp_path)[1], hf_io.load_checkpoint(path)[1])
    with pytest.raises(ValueError, match="layer_layout='rows'"):
        load_model(path, layer_layout="rows")
