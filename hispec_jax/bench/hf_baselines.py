"""Peer baselines on the same weights: transformers (PyTorch) greedy decoding and
transformers' LayerSkip self-speculation (`assistant_early_exit`).

Both decode greedily, one prompt at a time (assisted generation supports batch 1 only),
exactly `max_new_tokens` per prompt with EOS ignored, as `hispec_jax.generate(...,
ignore_eos=True)` does (`hf_generate` with `eos_token_ids`: up to `max_new_tokens`, each
prompt stopping at EOS). `hf_generate_batch` is plain greedy decoding of a whole batch in
one left-padded call (`hispec bench-tool compare --transformers`). PyTorch is imported lazily: the
rest of the library needs none.

Greedy settings are pinned: the model directory's generation_config.json is swapped for a
fresh config during each call, so no default from it (sampling, repetition penalty, ...)
applies. EOS is ignored by giving transformers no EOS id (it then never stops early and
never alters logits); `min_new_tokens` would instead mask EOS out of the argmax, which
changes the tokens whenever the model's greedy choice is EOS.

Draft length: transformers' early-exit drafter reads `num_assistant_tokens`,
`num_assistant_tokens_schedule` and `assistant_confidence_threshold` from the *model's*
`generation_config` (the assistant is the model itself), not from `generate()`'s
arguments, and by default stops drafting when the draft's top probability falls below
0.4. We set them there: schedule "constant", threshold 0, so every draft is exactly
`num_assistant_tokens` tokens long (fewer only at the end of the budget).
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from pathlib import Path
from typing import Callable

_TORCH_MISSING = "the transformers baselines need PyTorch: pip install torch==2.13.0"
DEFAULT_NUM_ASSISTANT_TOKENS = 20  # transformers' own default


@dataclasses.dataclass
class HFRun:
    """One baseline's result.

    Attributes:
      name: e.g. "transformers greedy", "transformers layerskip d=4 n=4".
      token_ids: new tokens per prompt ([P][max_new_tokens], fewer where a prompt stopped at
        EOS), from the last timed round.
      seconds: wall time per timed round ([rounds]), summed over that round's prompts.
      new_tokens: total new tokens per round (P * max_new_tokens without EOS).
    """

    name: str
    token_ids: list[list[int]]
    seconds: list[float]
    new_tokens: int

    @property
    def tokens_per_second(self) -> float:
        """Median over rounds of new_tokens / seconds."""
        return statistics.median(self.new_tokens / s for s in self.seconds)


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError(_TORCH_MISSING) from e
    return torch


def load_hf_model(model_path: str, threads: int | None = None):
    """The model at `model_path` (a Hugging Face directory, or a .gguf file transformers
    reads) as a transformers (PyTorch) model in float32 eval mode; sets
    torch.set_num_threads(threads) when given."""
    torch = _torch()
    from transformers import AutoModelForCausalLM

    if threads is not None:
        torch.set_num_threads(threads)
    path = Path(model_path)
    if path.suffix.lower() == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.eval()


def _configs(hf_model, max_new_tokens: int, assistant_early_exit: int | None,
             num_assistant_tokens: int, eos_token_ids: tuple[int, ...] = ()):
    """(model-level config, per-call config): greedy, no model-dir defaults, no EOS (or
    stopping at `eos_token_ids`).

    The early-exit drafter runs `generate` on the model itself with the model-level config
    as defaults, so `assistant_early_exit` goes in the per-call config only (else the
    drafter would draft with a drafter).
    """
    from transformers import GenerationConfig

    pad = hf_model.generation_config.pad_token_id
    if pad is None:
        eos = hf_model.generation_config.eos_token_id
        if eos is None:
            eos = hf_model.config.eos_token_id
        pad = (eos[0] if isinstance(eos, (list, tuple)) else eos) if eos is not None else 0
    base = GenerationConfig(
        do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
        eos_token_id=list(eos_token_ids) or None,
        pad_token_id=int(pad), repetition_penalty=1.0, no_repeat_ngram_size=0, use_cache=True,
        num_assistant_tokens=num_assistant_tokens, num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0)
    call = copy.deepcopy(base)
    call.assistant_early_exit = assistant_early_exit
    return base, call


def hf_generate(hf_model, prompts: list[list[int]], max_new_tokens: int, *, rounds: int = 1,
                assistant_early_exit: int | None = None, num_assistant_tokens: int | None = None,
                name: str | None = None, progress: Callable[[], object] | None = None,
                prompt_lookup_num_tokens: int | None = None,
                eos_token_ids: tuple[int, ...] = ()) -> HFRun:
    """Greedy generation of exactly max_new_tokens per prompt with `hf_model.generate` (with
    `eos_token_ids`: up to max_new_tokens, each prompt stopping at the first of them).

    One prompt at a time (batch 1: assisted generation supports batch 1 only), EOS ignored
    unless `eos_token_ids` are given; one untimed warm-up prompt (prompts[0]) first, then
    `rounds` timed rounds over all prompts.

    Args:
      hf_model: a transformers causal LM (see `load_hf_model`).
      prompts: P token-id lists ([P][prompt_len]), BOS included.
      max_new_tokens: new tokens per prompt (>= 1).
      rounds: timed rounds (>= 1).
      assistant_early_exit: LayerSkip self-speculation drafting from this many layers
        (1 <= d < num_hidden_layers); None = plain greedy.
      num_assistant_tokens: draft length per speculation step (constant); only with
        assistant_early_exit (default there: transformers' 20).
      name: the run's name (default "transformers greedy" / "transformers layerskip d=.. n=..").
      prompt_lookup_num_tokens: transformers' prompt-lookup decoding with this many tokens
        per n-gram draft (its `max_matching_ngram_size` default, 2); not with
        assistant_early_exit.
      progress: called after every prompt generated, warm-up included
        (1 + rounds * P calls), e.g. a progress bar's update.
    """
    torch = _torch()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: expected a non-empty list of non-empty token-id lists")
    if max_new_tokens < 1 or rounds < 1:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) and rounds ({rounds}) must be >= 1")
    if assistant_early_exit is None:
        if num_assistant_tokens is not None:
            raise ValueError("num_assistant_tokens needs assistant_early_exit")
        default_name = "transformers greedy"
    else:
        layers = hf_model.config.num_hidden_layers
        if not 1 <= assistant_early_exit < layers:
            raise ValueError(f"assistant_early_exit={assistant_early_exit} must be in "
                             f"[1, {layers})")
        if num_assistant_tokens is None:
            num_assistant_tokens = DEFAULT_NUM_ASSISTANT_TOKENS
        if num_assistant_tokens < 1:
            raise ValueError(f"num_assistant_tokens must be >= 1, got {num_assistant_tokens}")
        default_name = f"transformers layerskip d={assistant_early_exit} n={num_assistant_tokens}"
    base, call = _configs(hf_model, max_new_tokens, assistant_early_exit,
                          num_assistant_tokens or DEFAULT_NUM_ASSISTANT_TOKENS, eos_token_ids)
    if prompt_lookup_num_tokens is not None:
        if assistant_early_exit is not None or prompt_lookup_num_tokens < 1:
            raise ValueError("prompt_lookup_num_tokens must be >= 1, without assistant_early_exit")
        call.prompt_lookup_num_tokens = int(prompt_lookup_num_tokens)
        default_name = f"transformers prompt-lookup k={prompt_lookup_num_tokens}"
    device = hf_model.device

    def one(prompt: list[int]) -> tuple[list[int], float]:
        input_ids = torch.tensor([prompt], dtype=torch.long, device=device)
        t0 = time.perf_counter()
        out = hf_model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                generation_config=call)
        seconds = time.perf_counter() - t0
        new = out[0, len(prompt):].tolist()
        stopped_early = 0 < len(new) < max_new_tokens and new[-1] in eos_token_ids
        if len(new) != max_new_tokens and not stopped_early:
            raise RuntimeError(f"transformers generated {len(new)} tokens, "
                               f"expected {max_new_tokens}" + (" or fewer ending at EOS"
                                                               if eos_token_ids else ""))
        if progress is not None:
            progress()
        return new, seconds

    saved = hf_model.generation_config
    hf_model.generation_config = base
    try:
        with torch.inference_mode():
            one(list(prompts[0]))  # warm-up, untimed
            seconds, token_ids = [], []
            for _ in range(rounds):
                results = [one(list(p)) for p in prompts]
                token_ids = [tokens for tokens, _ in results]
                seconds.append(sum(s for _, s in results))
    finally:
        hf_model.generation_config = saved
    return HFRun(name=name or default_name, token_ids=token_ids, seconds=seconds,
                 new_tokens=sum(map(len, token_ids)))


def hf_generate_batch(hf_model, prompts: list[list[int]], max_new_tokens: int
                      ) -> tuple[list[list[int]], float]:
    """Greedy generation of exactly max_new_tokens per prompt, every prompt in one
    `hf_model.generate` call: the ragged prompts ([P][prompt_len]) left-padded to
    [P, longest] with an attention mask, transformers' default (dynamic) KV cache, EOS
    ignored and greedy settings pinned as in `hf_generate`.

    Returns (new tokens [P][max_new_tokens], wall seconds of the generate call).
    """
    torch = _torch()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: expected a non-empty list of non-empty token-id lists")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    base, call = _configs(hf_model, max_new_tokens, None, DEFAULT_NUM_ASSISTANT_TOKENS)
    longest = max(map(len, prompts))
    ids = torch.full((len(prompts), longest), base.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.long)
    for b, p in enumerate(prompts):  # left padding: every row's last token is its prompt's
        ids[b, longest - len(p):] = torch.tensor(p)
        mask[b, longest - len(p):] = 1
    saved = hf_model.generation_config
    hf_model.generation_config = base
    try:
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = hf_model.generate(input_ids=ids.to(hf_model.device),
                                    attention_mask=mask.to(hf_model.device),
                                    generation_config=call)
            seconds = time.perf_counter() - t0
    finally:
        hf_model.generation_config = saved
    new = out[:, longest:].tolist()
    if any(len(t) != max_new_tokens for t in new):
        raise RuntimeError(f"transformers generated {len(new[0])} tokens per row, "
                           f"expected {max_new_tokens}")
    return new, seconds
