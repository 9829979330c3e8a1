"""The OpenAI API's request and response bodies (pydantic), and the checks a request passes
before it reaches the engine.

Requests forbid unknown fields and use strict types (`"5"` is not an integer). Every
problem is an `APIError`, answered with an OpenAI-style body and a 4xx status:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
               "code": null}}

Supported: max_tokens / max_completion_tokens, temperature, top_p, top_k (an extension, as
vLLM's), stop (up to 4 strings), seed, stream, stream_options.include_usage, n = 1, user,
and vLLM's sampling extensions that load tools send: ignore_eos (decode past EOS and
end-of-turn tokens, to the token budget) and min_tokens (EOS and end-of-turn tokens
suppressed in the model's choice until that many new tokens; at most the budget), and this
server's own `hispec` options (`{"cross_request": false}`: no drafts from earlier requests,
and this one's tokens kept for none).
Parameters that would change the output in ways the engine cannot honour (n > 1, logprobs,
tools, penalties, logit_bias, response formats, echo, suffix, best_of > 1) are rejected, not
ignored.
"""

from __future__ import annotations

from typing import Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_serializer)

MAX_STOP = 4


class APIError(Exception):
    """A request the API refuses: HTTP status, message, the parameter at fault."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = (
            status, message, param, type_, code)

    def body(self) -> dict:
        return error_body(self.message, self.param, self.type, self.code)


def error_body(message: str, param: str | None = None, type_: str = "invalid_request_error",
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# ---- requests -----------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart]]
    name: str | None = None

    def as_dict(self) -> dict:
        """{"role", "content"} as a chat template takes it (developer is system)."""
        content = (self.content if isinstance(self.content, str)
                   else "".join(p.text for p in self.content))
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class HispecOptions(_Strict):
    """This server's own request options (`"hispec": {...}`, `extra_body` in the openai
    client)."""

    # draft from earlier requests' tokens, and leave this one's for later ones (where the
    # server keeps a store: `hispec serve`, docs/serving.md); False: neither
    cross_request: StrictBool = True


class SamplingRequest(_Strict):
    """The fields both endpoints share."""

    model: str
    max_tokens: StrictInt | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=0)
    stop: Union[str, list[str], None] = None
    seed: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt | None = None
    user: str | None = None
    # vLLM's extensions (`extra_body` in the openai client)
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = Field(default=0, ge=0)
    # this server's extensions
    hispec: HispecOptions | None = None
    # Known OpenAI parameters the engine does not implement: rejected unless neutral.
    logprobs: Union[StrictBool, StrictInt, None] = None
    top_logprobs: StrictInt | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def check_supported(self) -> None:
        """Raises `APIError` for a parameter the engine cannot honour."""
        if self.n not in (None, 1):
            raise APIError(400, f"n={self.n} is not supported: this server returns one choice "
                           "per request (send n requests)", "n")
        if self.logprobs not in (None, False, 0) or self.top_logprobs:
            raise APIError(400, "logprobs are not supported by this server", "logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise APIError(400, f"{name} is not supported by this server (only 0)", name)
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported by this server", "logit_bias")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed when stream is true",
                           "stream_options")

    def stop_strings(self) -> list[str]:
        """`stop` as a list of at most `MAX_STOP` non-empty strings."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP:
            raise APIError(400, f"stop: at most {MAX_STOP} sequences, got {len(stops)}", "stop")
        if any(s == "" for s in stops):
            raise APIError(400, "stop: empty strings are not allowed", "stop")
        return stops


class ChatRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    tools: list | None = None
    tool_choice: Union[str, dict, None] = None
    parallel_tool_calls: StrictBool | None = None
    response_format: dict | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.tools or self.tool_choice not in (None, "none"):
            raise APIError(400, "tools / tool calls are not supported by this server", "tools")
        if self.response_format not in (None, {"type": "text"}):
            raise APIError(400, "response_format other than {'type': 'text'} is not supported",
                           "response_format")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise APIError(400, "give max_tokens or max_completion_tokens, not both",
                           "max_completion_tokens")


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    prompt: Union[str, list[str], list[StrictInt]]
    echo: StrictBool | None = None
    suffix: str | None = None
    best_of: StrictInt | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise APIError(400, "echo is not supported by this server", "echo")
        if self.suffix:
            raise APIError(400, "suffix is not supported by this server", "suffix")
        if self.best_of not in (None, 1):
            raise APIError(400, "best_of > 1 is not supported by this server", "best_of")


# ---- responses ----------------------------------------------------------------------------
FinishReason = Literal["stop", "length"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class _Response(BaseModel):
    """Fields every response and chunk has."""

    id: str
    created: int
    model: str
    system_fingerprint: str


class ChatMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessage
    logprobs: None = None
    finish_reason: FinishReason | None


class ChatCompletion(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    """A chunk's change to the message: the role first, then content; the last chunk's is
    empty. Fields left unset are not written."""

    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer
    def _set_fields(self) -> dict:
        return {k: v for k, v in (("role", self.role), ("content", self.content))
                if v is not None}


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(_Response):
    """One server-sent event of a streamed chat completion. `usage` is written only when the
    request asked for it: null in every chunk, the counts in a last chunk without choices."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: FinishReason | None = None


class Completion(_Response):
    """A /v1/completions response, and (with `usage` as in `ChatCompletionChunk`) each
    chunk of a streamed one."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "hispec-jax"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
