"""The OpenAI-compatible HTTP API (FastAPI on uvicorn): /v1/chat/completions,
/v1/completions, /v1/models and /health, with and without streaming (server-sent events
ending in `data: [DONE]`).

Requests are pydantic models with unknown fields forbidden; every problem is answered with
an OpenAI-style error body and a 4xx status before anything reaches the engine:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
               "code": null}}

Supported: max_tokens / max_completion_tokens, temperature, top_p, top_k (an extension, as
vLLM's), stop (up to 4 strings), seed, stream, stream_options.include_usage, n = 1, user.
Parameters that would change the output in ways the engine cannot honour (n > 1, logprobs,
tools, penalties, logit_bias, response formats, echo, suffix, best_of > 1) are rejected, not
ignored. Defaults are OpenAI's: temperature 1 (0 = greedy), top_p 1; max_tokens: 16 for
/v1/completions, the rest of the slot's cache for chat.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from typing import Literal, Union

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt
from starlette.exceptions import HTTPException as StarletteHTTPException

from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.serving import detok as detok_lib
from hispec_jax.serving import prompts as prompts_lib
from hispec_jax.serving.scheduler import Job, Scheduler

MAX_STOP = 4


class APIError(Exception):
    """A request the API refuses: HTTP status, message, the parameter at fault."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = (
            status, message, param, type_, code)


def error_response(status: int, message: str, param=None, type_="invalid_request_error",
                   code=None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {
        "message": message, "type": type_, "param": param, "code": code}})


# ---- request bodies ---------------------------------------------------------------------
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


class _Sampling(_Strict):
    """Fields both endpoints share."""

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
    # Known OpenAI parameters the engine does not implement: rejected unless neutral.
    logprobs: Union[StrictBool, StrictInt, None] = None
    top_logprobs: StrictInt | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    tools: list | None = None
    tool_choice: Union[str, dict, None] = None
    parallel_tool_calls: StrictBool | None = None
    response_format: dict | None = None


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[StrictInt]]
    echo: StrictBool | None = None
    suffix: str | None = None
    best_of: StrictInt | None = None


def _check_unsupported(body: _Sampling) -> None:
    if body.n not in (None, 1):
        raise APIError(400, f"n={body.n} is not supported: this server returns one choice "
                       "per request (send n requests)", "n")
    if body.logprobs not in (None, False, 0) or body.top_logprobs:
        raise APIError(400, "logprobs are not supported by this server", "logprobs")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name) not in (None, 0, 0.0):
            raise APIError(400, f"{name} is not supported by this server (only 0)", name)
    if body.logit_bias:
        raise APIError(400, "logit_bias is not supported by this server", "logit_bias")
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")
    if isinstance(body, ChatRequest):
        if body.tools or body.tool_choice not in (None, "none"):
            raise APIError(400, "tools / tool calls are not supported by this server", "tools")
        if body.response_format not in (None, {"type": "text"}):
            raise APIError(400, "response_format other than {'type': 'text'} is not supported",
                           "response_format")
        if body.max_tokens is not None and body.max_completion_tokens is not None:
            raise APIError(400, "give max_tokens or max_completion_tokens, not both",
                           "max_completion_tokens")
    if isinstance(body, CompletionRequest):
        if body.echo:
            raise APIError(400, "echo is not supported by this server", "echo")
        if body.suffix:
            raise APIError(400, "suffix is not supported by this server", "suffix")
        if body.best_of not in (None, 1):
            raise APIError(400, "best_of > 1 is not supported by this server", "best_of")


def _stop_strings(stop) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP:
        raise APIError(400, f"stop: at most {MAX_STOP} sequences, got {len(stops)}", "stop")
    if any(s == "" for s in stops):
        raise APIError(400, "stop: empty strings are not allowed", "stop")
    return stops


# ---- one request's text: detokenization and stop strings --------------------------------
class Completion:
    """Turns a job's token events into the text a client sees: stable deltas, cut at the
    first stop string (text that might be the start of a stop string is held back)."""

    def __init__(self, tokenizer, stops: list[str]):
        self.detok = detok_lib.TextDeltas(tokenizer)
        self.stops = stops
        self.sent = 0  # characters handed out
        self.stopped = False
        self.completion_tokens = 0

    def _visible(self, text: str, final: bool) -> str:
        """The new text to hand out given everything decoded so far."""
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            end = cut
        elif final:
            end = len(text)
        else:  # hold back a tail that could begin a stop string
            hold = max((k for s in self.stops for k in range(1, len(s))
                        if text.endswith(s[:k])), default=0)
            end = len(text) - hold
        delta = text[self.sent:max(end, self.sent)]
        self.sent = max(end, self.sent)
        return delta

    def push(self, token_ids) -> str:
        self.completion_tokens += len(token_ids)
        self.detok.push(token_ids)
        return self._visible(self.detok.text, final=False)

    def finish(self) -> str:
        self.detok.finish()
        return self._visible(self.detok.text, final=True)


# ---- the app ------------------------------------------------------------------------------
def create_app(model, scheduler: Scheduler, model_name: str, method: str) -> FastAPI:
    """The ASGI app serving `model` through `scheduler` (started and stopped with the app)."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if not scheduler.alive:
            scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="hispec-jax", lifespan=lifespan)
    created = int(time.time())

    @app.exception_handler(APIError)
    async def _api_error(request, e: APIError):
        return error_response(e.status, e.message, e.param, e.type, e.code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, e: RequestValidationError):
        err = e.errors()[0]
        if err.get("type") == "json_invalid":
            return error_response(400, "the request body is not valid JSON "
                                  f"({err.get('ctx', {}).get('error', err.get('msg'))})")
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        param = ".".join(loc) or None
        if err.get("type") == "extra_forbidden":
            message = f"unknown parameter: {param}"
        elif err.get("type") == "missing":
            message = f"missing required parameter: {param}"
        else:
            message = f"{param}: {err.get('msg')}" if param else str(err.get("msg"))
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, e: StarletteHTTPException):
        type_ = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return error_response(e.status_code, f"{request.method} {request.url.path}: {e.detail}",
                              type_=type_)

    @app.get("/health")
    async def health():
        if not scheduler.alive:
            return error_response(503, "the engine thread is not running", type_="server_error")
        return {"status": "ok", "model": model_name, "method": method, **scheduler.load()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [
            {"id": model_name, "object": "model", "created": created, "owned_by": "hispec-jax"}]}

    def _check_model(name: str) -> None:
        if name != model_name:
            raise APIError(404, f"The model `{name}` does not exist (this server serves "
                           f"`{model_name}`)", "model", code="model_not_found")

    def _sampling(body: _Sampling) -> SamplingParams:
        temperature = 1.0 if body.temperature is None else float(body.temperature)
        seed = body.seed if body.seed is not None else secrets.randbelow(2 ** 31)
        if not -2 ** 63 <= seed < 2 ** 63:
            raise APIError(400, f"seed {seed} is out of range", "seed")
        return SamplingParams(temperature=temperature, top_k=body.top_k or 0,
                              top_p=1.0 if body.top_p is None else float(body.top_p),
                              seed=seed % 2 ** 32)

    def _budget(prompt_ids: list[int], max_tokens, param: str, default: int | None,
                engine, prompt_param: str) -> int:
        """The token budget: `max_tokens` checked against what fits the slot's cache."""
        n = len(prompt_ids)
        room = engine.capacity - engine.lookahead - n
        if room < 1:
            raise APIError(400, f"the prompt has {n} tokens; this server's context holds "
                           f"{engine.capacity - engine.lookahead - 1} prompt tokens at most "
                           "(hispec serve --max-cache-len)", prompt_param,
                           code="context_length_exceeded")
        if max_tokens is None:
            return room if default is None else min(default, room)
        if max_tokens < 1:
            raise APIError(400, f"{param} must be at least 1, got {max_tokens}", param)
        if max_tokens > room:
            raise APIError(400, f"{param}={max_tokens} plus the prompt's {n} tokens exceed "
                           f"this server's context of {engine.capacity - engine.lookahead} "
                           f"tokens (at most {room} new tokens fit)", param,
                           code="context_length_exceeded")
        return max_tokens

    async def _run(prompt_ids: list[int], budget: int, sampling, stops: list[str], chat: bool,
                   include_usage: bool, stream: bool):
        """Submits the job and answers with its completion (JSON) or its chunks (SSE)."""
        if not scheduler.alive:
            raise APIError(503, "the engine is not running", type_="server_error")
        loop = asyncio.get_running_loop()
        job = Job(prompt_ids=prompt_ids, max_new_tokens=budget, sampling=sampling, loop=loop,
                  queue=asyncio.Queue())
        completion = Completion(model.tokenizer, stops)
        rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        now = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        def usage():
            return {"prompt_tokens": len(prompt_ids),
                    "completion_tokens": completion.completion_tokens,
                    "total_tokens": len(prompt_ids) + completion.completion_tokens}

        async def events():
            """(text delta, finish_reason or None) until the job ends."""
            scheduler.submit(job)
            finished = False
            try:
                while True:
                    kind, value = await job.queue.get()
                    if kind == "tokens":
                        delta = completion.push(value)
                        if completion.stopped:
                            scheduler.cancel(job)
                            finished = True
                            yield delta, "stop"
                            return
                        if delta:
                            yield delta, None
                    else:
                        finished = True
                        if value == "error":
                            raise APIError(500, "the engine failed", type_="server_error")
                        delta = completion.finish()
                        yield delta, ("stop" if completion.stopped or value == "stop"
                                      else "length")
                        return
            finally:
                if not finished:  # the client went away (or the server is stopping)
                    scheduler.cancel(job)

        if not stream:
            text, reason = "", None
            async for delta, finish in events():
                text += delta
                reason = finish or reason
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": None, "finish_reason": reason} if chat else
                      {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
            return JSONResponse({"id": rid, "object": obj, "created": now, "model": model_name,
                                 "system_fingerprint": method, "choices": [choice],
                                 "usage": usage()})

        def chunk(delta: str | None, finish, role: bool = False):
            if chat:
                d = {"role": "assistant", "content": ""} if role else (
                    {} if delta is None else {"content": delta})
                choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta or "", "logprobs": None,
                          "finish_reason": finish}
            body = {"id": rid, "object": obj + ".chunk" if chat else obj, "created": now,
                    "model": model_name, "system_fingerprint": method, "choices": [choice]}
            if include_usage:
                body["usage"] = None
            return f"data: {json.dumps(body)}\n\n"

        async def sse():
            if chat:
                yield chunk(None, None, role=True)
            try:
                async for delta, finish in events():
                    if finish is None:
                        yield chunk(delta, None)
                    else:
                        if delta:
                            yield chunk(delta, None)
                        yield chunk(None, finish)
            except APIError as e:  # the status line is sent: report it in the stream
                yield f"data: {json.dumps({'error': {'message': e.message, 'type': e.type}})}\n\n"
            if include_usage:
                body = {"id": rid, "object": obj + ".chunk" if chat else obj, "created": now,
                        "model": model_name, "system_fingerprint": method, "choices": [],
                        "usage": usage()}
                yield f"data: {json.dumps(body)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest):
        _check_model(body.model)
        _check_unsupported(body)
        stops = _stop_strings(body.stop)
        sampling = _sampling(body)
        messages = [{"role": "system" if m.role == "developer" else m.role,
                     "content": m.content if isinstance(m.content, str)
                     else "".join(p.text for p in m.content)} for m in body.messages]
        prompt_ids, _ = prompts_lib.conversation_ids(model, messages)
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        budget = _budget(prompt_ids, body.max_completion_tokens if param != "max_tokens"
                         else body.max_tokens, param, None, scheduler.engine_for(sampling),
                         "messages")
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await _run(prompt_ids, budget, sampling, stops, True, include_usage, body.stream)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        _check_model(body.model)
        _check_unsupported(body)
        stops = _stop_strings(body.stop)
        sampling = _sampling(body)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, f"prompt: one prompt per request, got {len(prompt)}",
                               "prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise APIError(400, "prompt is empty", "prompt")
            prompt_ids = list(model.tokenizer(prompt)["input_ids"])
        else:
            prompt_ids = list(prompt)
            if not prompt_ids:
                raise APIError(400, "prompt is empty", "prompt")
            bad = [t for t in prompt_ids if not 0 <= t < model.cfg.vocab_size]
            if bad:
                raise APIError(400, f"prompt: token id {bad[0]} is outside the vocabulary "
                               f"[0, {model.cfg.vocab_size})", "prompt")
        budget = _budget(prompt_ids, body.max_tokens, "max_tokens", 16,
                         scheduler.engine_for(sampling), "prompt")
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await _run(prompt_ids, budget, sampling, stops, False, include_usage, body.stream)

    return app
