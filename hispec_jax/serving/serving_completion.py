"""POST /v1/completions: a prompt (a string, a one-element list of strings, or token ids)
and its continuation, whole or as chunks of text. Without `max_tokens` the continuation is
16 tokens long (OpenAI's default), or what fits the slot's cache if less.
"""

from __future__ import annotations

from hispec_jax.serving import protocol
from hispec_jax.serving.protocol import APIError
from hispec_jax.serving.serving_engine import Generation, OpenAIServing


class OpenAIServingCompletion(OpenAIServing):
    id_prefix = "cmpl-"
    prompt_param = "prompt"
    default_max_tokens = 16

    def prompt_ids(self, body: protocol.CompletionRequest) -> list[int]:
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, f"prompt: one prompt per request, got {len(prompt)}",
                               "prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise APIError(400, "prompt is empty", "prompt")
            return list(self.model.tokenizer(prompt)["input_ids"])
        if not prompt:
            raise APIError(400, "prompt is empty", "prompt")
        vocab = self.model.cfg.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"prompt: token id {bad[0]} is outside the vocabulary "
                           f"[0, {vocab})", "prompt")
        return list(prompt)

    def response(self, gen: Generation, text: str, finish: str) -> protocol.Completion:
        choice = protocol.CompletionChoice(text=text, finish_reason=finish)
        return protocol.Completion(**self.header(gen), choices=[choice], usage=gen.usage())

    def chunk(self, gen: Generation, delta: str | None,
              finish: str | None) -> protocol.Completion:
        choice = protocol.CompletionChoice(text=delta or "", finish_reason=finish)
        return protocol.Completion(**self.header(gen), choices=[choice])

    def usage_chunk(self, gen: Generation) -> protocol.Completion:
        return protocol.Completion(**self.header(gen), choices=[], usage=gen.usage())
