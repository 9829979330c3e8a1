"""Conversations as prompts for `hispec chat` and `/v1/chat/completions`.

A model with a chat template renders the conversation with it (`decoding/chat.py`, as
`generate(..., chat=True)`) and stops at its end-of-turn markers as at EOS. A model without
one (the small shipped model) gets a plain transcript in the shipped model's conversation
format (`train_heads/data.py`: "User: ..." / "Assistant: ..." lines), ending where the
assistant's answer starts:

    System: Be brief.
    User: Hello
    Assistant:
"""

from __future__ import annotations

from hispec_jax.decoding import chat as chat_lib

ROLES = ("system", "user", "assistant")


def has_chat_template(model) -> bool:
    return bool(model.tokenizer is not None and getattr(model.tokenizer, "chat_template", None))


def transcript(messages: list[dict]) -> str:
    """The plain-text rendering of a conversation (no chat template)."""
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(lines + ["Assistant:"])


def conversation_prompt(model, messages: list[dict]) -> tuple[object, bool]:
    """(prompt, chat) to pass to `generate` / `generate_stream`: the conversation itself
    with chat=True when the model has a template, else its transcript with chat=False."""
    if has_chat_template(model):
        return messages, True
    return transcript(messages), False


def conversation_ids(model, messages: list[dict]) -> tuple[list[int], tuple[int, ...]]:
    """(prompt token ids, the ids that end the answer: EOS and end-of-turn markers)."""
    if has_chat_template(model):
        (ids,) = chat_lib.chat_prompt_ids(model, [messages])
        eos = tuple(dict.fromkeys(model.eos_token_ids + chat_lib.end_of_turn_ids(model)))
        return ids, eos
    return list(model.tokenizer(transcript(messages))["input_ids"]), tuple(model.eos_token_ids)
