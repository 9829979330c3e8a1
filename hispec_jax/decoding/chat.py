"""Chat prompts: the model's chat template, and the tokens that end an assistant turn.

The template is the tokenizer's `chat_template` (from a GGUF file's `tokenizer.chat_template`
or a HF directory's tokenizer_config.json / chat_template.jinja). A prompt becomes

    tokenizer.apply_chat_template(messages, add_generation_prompt=True)   # text, then
    tokenizer(text, add_special_tokens=False)                             # token ids

(the template writes BOS itself where the model wants one, as transformers does). A string
prompt is one user message; a list of {"role", "content"} dicts is a whole conversation.

An instruct model ends its turn with a marker that is often not its EOS token (ChatML's
`<|im_end|>` when EOS is `<|endoftext|>`, Llama 3's `<|eot_id|>`). `end_of_turn_ids` returns
the markers of `END_OF_TURN_TOKENS` that the template uses and the vocabulary holds as one
token; generation stops at them as at EOS.
"""

from __future__ import annotations

from typing import Any, Sequence

END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>",
                      "<|endofturn|>")

Conversation = list[dict[str, Any]]


def _is_conversation(prompt) -> bool:
    return (isinstance(prompt, Sequence) and not isinstance(prompt, str) and len(prompt) > 0
            and all(isinstance(m, dict) for m in prompt))


def _template(model) -> str:
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise ValueError("chat=True needs a tokenizer with a chat template; the model has no "
                         "tokenizer")
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("chat=True: the model's tokenizer has no chat template "
                         "(tokenizer.chat_template in a GGUF file, chat_template in "
                         "tokenizer_config.json or chat_template.jinja in a HF directory)")
    return template if isinstance(template, str) else str(template)


def chat_prompt_ids(model, prompts) -> list[list[int]]:
    """Each prompt (a user message string, or a conversation: a list of {"role", "content"}
    dicts) rendered by the chat template with the assistant's turn opened, as token ids."""
    _template(model)
    if isinstance(prompts, str) or _is_conversation(prompts):
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError("prompts: expected a non-empty list of strings or conversations")
    out = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}]
        elif _is_conversation(prompt):
            messages = list(prompt)
            bad = [m for m in messages if not {"role", "content"} <= set(m)]
            if bad:
                raise ValueError(f"prompts[{i}]: every message needs 'role' and 'content', "
                                 f"got {bad[0]!r}")
        else:
            raise ValueError(f"prompts[{i}]: with chat=True a prompt is a string or a list of "
                             f"{{'role', 'content'}} messages, got {prompt!r}")
        text = model.tokenizer.apply_chat_template(messages, tokenize=False,
                                                   add_generation_prompt=True)
        out.append(list(model.tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


def end_of_turn_ids(model) -> tuple[int, ...]:
    """Ids of the end-of-turn markers the chat template uses (module docstring)."""
    template = _template(model)
    vocab = model.tokenizer.get_vocab()
    return tuple(vocab[t] for t in END_OF_TURN_TOKENS if t in template and t in vocab)
