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


def test_stop_at_eos_matches_ours(hf_model, tiny_dir, monkeypatch):
    """With EOS ids (`bench tasks --stop-at-eos`), transformers and our bench runners stop
    each prompt at its first EOS, with the same tokens and token counts as `generate`."""
    import types

    from hispec_jax.bench import tasks
    from hispec_jax.decoding import generate as generate_lib

    model = hispec_jax.load_model(tiny_dir[0])
    stops = generate_lib.stop_token_ids(model)
    assert stops == (tiny_dir[1],)
    ours = hispec_jax.generate(model, PROMPTS, method="ar", max_new_tokens=NEW).token_ids
    assert ours[0] == [tiny_dir[1]] and len(ours[1]) > 1  # one prompt stops at once
    run = hf_generate(hf_model, PROMPTS, NEW, eos_token_ids=stops)
    assert run.token_ids == ours and run.new_tokens == sum(map(len, ours))
    # the task bench: our AR and lookup, transformers greedy and prompt lookup, all stopping
    monkeypatch.setattr(tasks, "task_prompts", lambda model, task, n, m, chat: PROMPTS[:n])
    specs = tasks.specs
    monkeypatch.setattr(tasks, "specs", lambda *a: specs(*a)[:2])  # AR and lookup
    args = types.SimpleNamespace(prompts=2, auto_prompts=1, auto=False, recommended=False,
                                 max_prompt_tokens=64, max_new_tokens=NEW, rounds=1, lookup=4,
                                 hf_lookup=3, chat=False, stop_at_eos=True)
    result = tasks.run_task(model, hf_model, "summarize", args)
    assert result["stop_at_eos"] and result["output_lengths"] == [len(t) for t in ours]
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == ["ar", "lookup", "transformers greedy",
                          "transformers prompt-lookup k=3"]
    assert all(r["identical_to_ar"] for r in rows.values())
    for row in rows.values():  # tokens/s counts the tokens each prompt really got
        assert row["tokens_per_second"] == pytest.approx(
            sum(map(len, ours)) / row["seconds"][0])
    assert (f"summarize (2 prompts, up to {NEW} new tokens each, stopping at EOS: "
            f"{sum(map(len, ours))} in all, 1-{len(ours[1])} a prompt)") in tasks.markdown(result)


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
