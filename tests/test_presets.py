"""Model presets (configs/model_*.py) and `hispec init-model`: shapes, HF loadability, numerics."""

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from hispec_jax import ModelConfig, cli, generate, load_model
from hispec_jax.models import presets
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.params import param_specs
from hispec_jax.models.transformer import embed, run_layers_cached

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# (preset, (V, D, F, L, N, K, H), parameter count of the published checkpoint)
REAL_PRESETS = [
    ("llama3_8b", (128256, 4096, 14336, 32, 32, 8, 128), 8_030_261_248),
    ("llama3_1_8b", (128256, 4096, 14336, 32, 32, 8, 128), 8_030_261_248),
    ("llama2_70b", (32000, 8192, 28672, 80, 64, 8, 128), 68_976_648_192),
    ("qwen3_8b", (151936, 4096, 12288, 36, 32, 8, 128), 8_190_735_360),
]
SMALL = ["--config.num_layers=2", "--config.hidden_size=64", "--config.intermediate_size=128",
         "--config.num_heads=4", "--config.num_kv_heads=2", "--config.head_dim=16",
         "--config.max_position_embeddings=128"]


def shape_of(cfg: ModelConfig):
    return (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers,
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)


def num_params(cfg: ModelConfig) -> int:
    leaves = jax.tree.leaves(param_specs(cfg), is_leaf=lambda x: hasattr(x, "shape"))
    return sum(math.prod(s.shape) for s in leaves)


@pytest.mark.parametrize("name,shape,count", REAL_PRESETS)
def test_real_presets_have_published_shapes(name, shape, count):
    cfg = presets.load_preset(CONFIGS / f"model_{name}.py")
    assert shape_of(cfg) == shape
    assert cfg.dtype == "bfloat16"
    assert num_params(cfg) == count


def test_preset_details():
    qwen = presets.load_preset("qwen3_8b")
    assert (qwen.model_type, qwen.qk_norm, qwen.tie_word_embeddings) == ("qwen3", True, False)
    assert (qwen.rope_theta, qwen.max_position_embeddings, qwen.rms_norm_eps) == (1e6, 40960, 1e-6)
    llama31 = presets.load_preset("llama3_1_8b")
    assert llama31.rope_scaling_dict == {"rope_type": "llama3", "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}
    assert presets.load_preset("llama3_8b").rope_scaling is None
    tiny = presets.load_preset(CONFIGS / "model_tiny.py")
    assert tiny.vocab_size >= presets.BYTE_VOCAB_SIZE
    assert (tiny.model_type, tiny.dtype, tiny.max_position_embeddings) == ("llama", "float32", 2048)


def test_every_preset_names_every_field():
    fields = set(ModelConfig.__dataclass_fields__)
    for path in sorted(CONFIGS.glob("model_*.py")):
        assert set(presets.load_config(path).keys()) == fields, path.name


def test_missing_unknown_and_bad_keys_raise():
    config = presets.load_config("tiny")
    with pytest.raises(ValueError, match="no key 'num_layer'"):
        presets.apply_overrides(config, {"num_layer": "2"})
    with pytest.raises(ValueError, match="'num_layers'.*'two'"):
        presets.apply_overrides(config, {"num_layers": "two"})
    config.extra = 1
    with pytest.raises(ValueError, match="unknown key.*extra"):
        presets.model_config_from_ml_collections(config)
    del config["extra"]
    del config["qk_norm"]
    with pytest.raises(ValueError, match="missing key.*qk_norm"):
        presets.model_config_from_ml_collections(config)
    with pytest.raises(ValueError, match="neither a file nor a preset"):
        presets.load_config("no_such_preset")


def test_overrides_parse_by_type():
    config = presets.load_config("tiny")
    presets.apply_overrides(config, {
        "num_layers": "3", "rope_theta": "500000", "tie_word_embeddings": "true",
        "rope_scaling": "{'rope_type': 'linear', 'factor': 2.0}", "dtype": "bfloat16"})
    cfg = presets.model_config_from_ml_collections(config)
    assert (cfg.num_layers, cfg.rope_theta, cfg.tie_word_embeddings, cfg.dtype) == (
        3, 500000.0, True, "bfloat16")
    assert cfg.rope_scaling_dict == {"rope_type": "linear", "factor": 2.0}


def test_init_random_model_rejects_small_vocab():
    cfg = presets.load_preset("tiny").replace(vocab_size=100)
    with pytest.raises(ValueError, match="does not cover"):
        presets.init_random_model(cfg)


def test_init_model_cli_rejects_stray_arguments(tmp_path, capsys):
    assert cli.main(["init-model", str(tmp_path), "--config.num_layers"]) == 2
    assert "--config.KEY=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["generate", "--model", str(tmp_path), "--config.num_layers=2", "x"])


@pytest.fixture(scope="module")
def init_model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("init_model")
    # init_std 0.3 keeps greedy argmaxes well separated (as in conftest's random HF models).
    assert cli.main(["init-model", str(out), "--config", str(CONFIGS / "model_tiny.py"),
                     "--seed", "3", "--init-std", "0.3", *SMALL]) == 0
    return out


def test_init_model_writes_hf_layout(init_model_dir):
    hf_config = json.loads((init_model_dir / "config.json").read_text())
    assert hf_config["num_hidden_layers"] == 2 and hf_config["hidden_size"] == 64
    assert hf_config["vocab_size"] == 259
    assert (hf_config["bos_token_id"], hf_config["eos_token_id"]) == (1, 2)
    for name in ("model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (init_model_dir / name).exists(), name


def test_init_model_loads_in_transformers_with_matching_logits(init_model_dir):
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(str(init_model_dir)).eval()
    model = load_model(init_model_dir)
    tokens = np.random.RandomState(0).randint(0, model.cfg.vocab_size, (2, 17))
    with torch.no_grad():
        ref = hf_model(torch.tensor(tokens)).logits.numpy()
    positions = jnp.broadcast_to(jnp.arange(17), (2, 17))
    cache = KVCache.zeros(model.cfg, 2, 32)
    h, _ = run_layers_cached(model.params, model.cfg, embed(model.params, jnp.asarray(tokens)),
                             positions, cache, 0, model.cfg.num_layers)
    ours = np.asarray(exit_logits(model.params, {}, model.cfg, h, model.cfg.num_layers))
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_init_model_tokenizer_round_trips(init_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(init_model_dir))
    text = "Hello, wörld!  tabs\tand\nnewlines 🙂"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id == 1 and tok.eos_token_id == 2
    assert ids[1:] == [b + 3 for b in text.encode("utf-8")]
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert load_model(init_model_dir).tokenizer(text)["input_ids"] == ids


def test_init_model_generates_like_transformers(init_model_dir, capsys):
    """Greedy `hispec generate` on the written model == transformers' greedy generate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert cli.main(["generate", "--model", str(init_model_dir), "--max-new-tokens", "8",
                     "--ignore-eos", "--json", "Hello"]) == 0
    ours = json.loads(capsys.readouterr().out)["outputs"][0]["token_ids"]
    hf_model = AutoModelForCausalLM.from_pretrained(str(init_model_dir)).eval()
    prompt = AutoTokenizer.from_pretrained(str(init_model_dir))("Hello", return_tensors="pt")
    with torch.no_grad():
        ref = hf_model.generate(**prompt, do_sample=False, max_new_tokens=8, min_new_tokens=8,
                                pad_token_id=0)
    # HF's min_new_tokens bans EOS, ours ignores it: equal only while ours emits no EOS.
    assert len(ours) == 8 and 2 not in ours
    assert ours == ref[0, prompt["input_ids"].shape[1]:].tolist()
    assert generate(load_model(init_model_dir), ["Hello"], method="ar", max_new_tokens=8,
                    ignore_eos=True).token_ids[0] == ours
