"""The transformers baselines (`hispec_jax.bench.hf_baselines`) on a tiny random Llama:
greedy and LayerSkip self-speculation both reproduce our greedy tokens exactly, ignoring
EOS and the model directory's sampling defaults, with drafts of exactly the asked length."""

import sys

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.generation import candidate_generator

import hispec_jax
from hispec_jax.bench import hf_baselines
from hispec_jax.bench.hf_baselines import HFRun, hf_generate, load_hf_model

PROMPTS = [[1, 5, 6, 7], [1, 9, 10, 11, 12, 13]]
NEW = 20


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random tied-embedding Llama whose generation_config.json asks for sampling with
    a repetition penalty, and whose EOS is the greedy first token of PROMPTS[0]."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      initializer_range=0.3, max_position_embeddings=256, bos_token_id=1,
                      eos_token_id=2, rms_norm_eps=1e-6)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        eos = int(model(torch.tensor([PROMPTS[0]])).logits[0, -1].argmax())
    model.config.eos_token_id = eos
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=eos, do_sample=True,
                                               temperature=0.7, top_k=5, repetition_penalty=1.5)
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    return path, eos


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    return load_hf_model(str(tiny_dir[0]))


@pytest.fixture(scope="module")
def ours(tiny_dir):
    model = hispec_jax.load_model(tiny_dir[0])
    return hispec_jax.generate(model, PROMPTS, method="ar", max_new_tokens=NEW,
                               ignore_eos=True).token_ids


@pytest.fixture(scope="module")
def greedy(hf_model):
    calls = []
    run = hf_generate(hf_model, PROMPTS, NEW, rounds=2, progress=lambda: calls.append(1))
    return run, len(calls)


def test_greedy_matches_ours(greedy, ours, hf_model, tiny_dir):
    run, progress_calls = greedy
    assert run.name == "transformers greedy"
    assert [len(t) for t in run.token_ids] == [NEW] * len(PROMPTS)
    assert run.token_ids == ours
    assert run.token_ids[0][0] == tiny_dir[1]  # EOS emitted (not masked), generation goes on
    assert len(run.seconds) == 2 and run.new_tokens == NEW * len(PROMPTS)
    assert progress_calls == 1 + 2 * len(PROMPTS)  # warm-up + 2 rounds
    assert hf_model.generation_config.do_sample  # the model's own config is restored


def test_layerskip_lossless_with_constant_drafts(greedy, ours, hf_model, tiny_dir, monkeypatch):
    drafts = []  # (draft length, what a constant schedule of 3 allows at that point)
    get_candidates = candidate_generator.EarlyExitCandidateGenerator.get_candidates

    def recording(self, input_ids, **kwargs):
        ids, logits = get_candidates(self, input_ids, **kwargs)
        drafts.append((ids.shape[1] - input_ids.shape[1],
                       min(3, self.main_model_max_length - input_ids.shape[1] - 1)))
        return ids, logits

    monkeypatch.setattr(candidate_generator.EarlyExitCandidateGenerator, "get_candidates",
                        recording)
    run = hf_generate(hf_model, PROMPTS, NEW, assistant_early_exit=2, num_assistant_tokens=3)
    assert run.name == "transformers layerskip d=2 n=3"
    assert run.token_ids == greedy[0].token_ids == ours
    assert drafts and all(got == want for got, want in drafts)
    assert sum(got == 3 for got, _ in drafts) > len(drafts) // 2

    layerskip = hispec_jax.generate(hispec_jax.load_model(tiny_dir[0]), PROMPTS,
                                    method="layerskip", draft_exit=2, max_new_tokens=NEW,
                                    ignore_eos=True)
    assert layerskip.token_ids == ours


def test_tokens_per_second_is_median(greedy):
    assert greedy[0].tokens_per_second > 0
    run = HFRun(name="x", token_ids=[[0] * 4] * 2, seconds=[1.0, 2.0, 4.0, 8.0], new_tokens=8)
    assert run.tokens_per_second == 3.0  # median of 8, 4, 2, 1 tokens/s


def test_bad_arguments(hf_model):
    with pytest.raises(ValueError, match="needs assistant_early_exit"):
        hf_generate(hf_model, PROMPTS, 4, num_assistant_tokens=3)
    with pytest.raises(ValueError, match="assistant_early_exit"):
        hf_generate(hf_model, PROMPTS, 4, assistant_early_exit=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        hf_generate(hf_model, PROMPTS, 0)


def test_missing_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match="pip install torch==2.13.0"):
        hf_baselines.load_hf_model("unused")
