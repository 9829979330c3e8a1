"""POST /v1/chat/completions: a conversation becomes a prompt (the model's chat template, or
a plain transcript: `prompts.py`) and the answer an assistant message, whole or as chunks
(a first chunk with the role, then content deltas, then the finish reason).

Without `max_tokens` / `max_completion_tokens` the answer may fill the rest of the slot's
cache; it stops at EOS and at the chat template's end-of-turn markers.
"""

from __future__ import annotations

from hispec_jax.serving import prompts as prompts_lib
from hispec_jax.serving import protocol
from hispec_jax.serving.serving_engine import Generation, OpenAIServing


class OpenAIServingChat(OpenAIServing):
    id_prefix = "chatcmpl-"
    prompt_param = "messages"

    def prompt_ids(self, body: protocol.ChatRequest) -> list[int]:
        ids, _ = prompts_lib.conversation_ids(self.model, [m.as_dict() for m in body.messages])
        return ids

    def max_tokens(self, body: protocol.ChatRequest) -> tuple[int | None, str]:
        if body.max_completion_tokens is not None:
            return body.max_completion_tokens, "max_completion_tokens"
        return body.max_tokens, "max_tokens"

    def response(self, gen: Generation, text: str, finish: str) -> protocol.ChatCompletion:
        choice = protocol.ChatChoice(message=protocol.ChatMessage(content=text),
                                     finish_reason=finish)
        return protocol.ChatCompletion(**self.header(gen), choices=[choice], usage=gen.usage())

    def opening_chunks(self, gen: Generation) -> list[protocol.ChatCompletionChunk]:
        delta = protocol.ChatDelta(role="assistant", content="")
        return [protocol.ChatCompletionChunk(**self.header(gen),
                                             choices=[protocol.ChatChunkChoice(delta=delta)])]

    def chunk(self, gen: Generation, delta: str | None,
              finish: str | None) -> protocol.ChatCompletionChunk:
        choice = protocol.ChatChunkChoice(delta=protocol.ChatDelta(content=delta),
                                          finish_reason=finish)
        return protocol.ChatCompletionChunk(**self.header(gen), choices=[choice])

    def usage_chunk(self, gen: Generation) -> protocol.ChatCompletionChunk:
        return protocol.ChatCompletionChunk(**self.header(gen), choices=[], usage=gen.usage())
