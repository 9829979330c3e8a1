"""Request handling both endpoints share: a validated request becomes a job on the engine
thread, and the job's tokens become the response, whole (JSON) or streamed (server-sent
events ending in `data: [DONE]`).

    request --check_model, check_supported, stop_strings, sampling, budget--> Job
    Job --scheduler--> ("tokens", ids) ... ("done", reason)
        --OutputText: detokenize, cut at a stop string--> (delta, finish_reason)
        --response / chunk (the endpoint's)--> JSON or SSE

Subclasses (`serving_chat.py`, `serving_completion.py`) say how a request becomes prompt
token ids and how text becomes their response bodies. Defaults are OpenAI's: temperature 1
(0 = greedy), top_p 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import secrets
import time
from typing import AsyncIterator, Mapping

from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.decoding.suffix_store import NO_SCOPE
from hispec_jax.serving import detok as detok_lib
from hispec_jax.serving import protocol
from hispec_jax.serving.protocol import APIError
from hispec_jax.serving.scheduler import Job, Scheduler


CROSS_REQUEST_HEADER = "X-Hispec-Cross-Request"
_HEADER_VALUES = {"true": True, "1": True, "on": True, "yes": True,
                  "false": False, "0": False, "off": False, "no": False}


def cross_request_header(headers: Mapping[str, str]) -> bool | None:
    """`X-Hispec-Cross-Request` (true / false, 1 / 0, on / off, yes / no; any case) as a
    bool, None when absent; any other value is a 400 naming the header. `headers` a
    case-insensitive mapping (Starlette's) or a dict with lower-case names."""
    value = headers.get(CROSS_REQUEST_HEADER.lower())
    if value is None:
        return None
    flag = _HEADER_VALUES.get(value.strip().lower())
    if flag is None:
        raise APIError(400, f"header {CROSS_REQUEST_HEADER}: {value!r} is not true or false",
                       CROSS_REQUEST_HEADER)
    return flag


def api_key_digest(headers: Mapping[str, str]) -> str | None:
    """The request's API key (`Authorization: Bearer KEY`) as a SHA-256 hex digest (the
    store's scopes keep no key), None without one."""
    auth = headers.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return hashlib.sha256(key.strip().encode()).hexdigest()


class OutputText:
    """One request's text as the client sees it: detokenized deltas, cut before the stop
    string that is complete first (the earliest end; of two ending together, the longer),
    which does not depend on how the text is split into deltas. Text that could be the
    start of a stop string is held back until it cannot; a match never starts in text
    handed out, so each step searches only the held text and the new delta."""

    def __init__(self, tokenizer, stops: list[str]):
        self.detok = detok_lib.TextDeltas(tokenizer)
        self.stops = stops
        self.stopped = False
        self.completion_tokens = 0
        self._held = ""

    def push(self, token_ids) -> str:
        """Adds tokens; returns the text to hand out now."""
        self.completion_tokens += len(token_ids)
        return self._cut(self.detok.push(token_ids), final=False)

    def finish(self) -> str:
        """The rest of the text (the job is over)."""
        return self._cut(self.detok.finish(), final=True)

    def _cut(self, delta: str, final: bool) -> str:
        if self.stopped:
            return ""
        text = self._held + delta
        matches = [(i + len(s), i) for s in self.stops if (i := text.find(s)) >= 0]
        if matches:  # the stop string that is complete first ends the text
            _, cut = min(matches)
            self.stopped, self._held = True, ""
            return text[:cut]
        hold = 0 if final else max((k for s in self.stops for k in range(1, len(s))
                                    if text.endswith(s[:k])), default=0)
        self._held = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold]


@dataclasses.dataclass
class Generation:
    """One admitted request: its job on the engine thread and its text so far."""

    id: str
    created: int
    prompt_ids: list[int]
    job: Job
    text: OutputText
    include_usage: bool

    def usage(self) -> protocol.Usage:
        n, m = len(self.prompt_ids), self.text.completion_tokens
        return protocol.Usage(prompt_tokens=n, completion_tokens=m, total_tokens=n + m)


def sse(body: BaseModel, with_usage: bool) -> str:
    """One server-sent event; `usage` is written only when the request asked for it."""
    return f"data: {body.model_dump_json(exclude=None if with_usage else {'usage'})}\n\n"


class OpenAIServing:
    """Serves one endpoint of `model` through `scheduler`.

    Args:
      model: the loaded `Model` (its tokenizer and vocabulary size).
      scheduler: the engine thread.
      model_name: the model id clients send.
      method: the decoding method's name (the responses' `system_fingerprint`).
    """

    id_prefix = "cmpl-"
    prompt_param = "prompt"  # the parameter an over-long prompt is reported under
    default_max_tokens: int | None = None  # None: what fits the slot's cache

    def __init__(self, model, scheduler: Scheduler, model_name: str, method: str):
        self.model, self.scheduler = model, scheduler
        self.model_name, self.method = model_name, method

    # ---- what an endpoint defines ----------------------------------------------------------
    def prompt_ids(self, body) -> list[int]:
        raise NotImplementedError

    def max_tokens(self, body) -> tuple[int | None, str]:
        """(the requested budget or None, the parameter that gave it)."""
        return body.max_tokens, "max_tokens"

    def response(self, gen: Generation, text: str, finish: str) -> BaseModel:
        raise NotImplementedError

    def opening_chunks(self, gen: Generation) -> list[BaseModel]:
        """The chunks a stream starts with, before any text."""
        return []

    def chunk(self, gen: Generation, delta: str | None, finish: str | None) -> BaseModel:
        """A chunk with a text delta, or (delta None) the last one with `finish`."""
        raise NotImplementedError

    def usage_chunk(self, gen: Generation) -> BaseModel:
        """The chunk after the last one when the request asks for usage: no choices."""
        raise NotImplementedError

    def header(self, gen: Generation) -> dict:
        """The fields every response and chunk of `gen` starts with."""
        return {"id": gen.id, "created": gen.created, "model": self.model_name,
                "system_fingerprint": self.method}

    # ---- checks ------------------------------------------------------------------------------
    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(404, f"The model `{name}` does not exist (this server serves "
                           f"`{self.model_name}`)", "model", code="model_not_found")

    @staticmethod
    def sampling(body: protocol.SamplingRequest) -> SamplingParams:
        temperature = 1.0 if body.temperature is None else float(body.temperature)
        seed = body.seed if body.seed is not None else secrets.randbelow(2 ** 31)
        if not -2 ** 63 <= seed < 2 ** 63:
            raise APIError(400, f"seed {seed} is out of range", "seed")
        return SamplingParams(temperature=temperature, top_k=body.top_k or 0,
                              top_p=1.0 if body.top_p is None else float(body.top_p),
                              seed=seed % 2 ** 32)

    def scope(self, body: protocol.SamplingRequest, sampling: SamplingParams,
              headers: Mapping[str, str] | None = None) -> int:
        """The scope of earlier requests' tokens the request drafts from and enters
        (`suffix_store.SuffixStore.scope_of`): one per tenant, the request's API key (its
        SHA-256, never the key) and `user` field together; `NO_SCOPE` where the engine
        keeps no store or the request opts out (`"hispec": {"cross_request": false}` in the
        body, or the header `X-Hispec-Cross-Request: false`)."""
        header = cross_request_header(headers or {})
        store = self.scheduler.engine_for(sampling).store
        if (store is None or header is False
                or (body.hispec is not None and not body.hispec.cross_request)):
            return NO_SCOPE
        return store.scope_of((api_key_digest(headers or {}), body.user))

    def budget(self, prompt_ids: list[int], max_tokens: int | None, param: str,
               sampling: SamplingParams) -> int:
        """The token budget: `max_tokens` checked against what fits the slot's cache."""
        engine = self.scheduler.engine_for(sampling)
        n, context = len(prompt_ids), engine.capacity - engine.lookahead
        room = context - n
        if room < 1:
            raise APIError(400, f"the prompt has {n} tokens; this server's context holds "
                           f"{context - 1} prompt tokens at most (hispec serve "
                           "--max-cache-len)", self.prompt_param, code="context_length_exceeded")
        if max_tokens is None:
            return room if self.default_max_tokens is None else min(self.default_max_tokens,
                                                                     room)
        if max_tokens < 1:
            raise APIError(400, f"{param} must be at least 1, got {max_tokens}", param)
        if max_tokens > room:
            raise APIError(400, f"{param}={max_tokens} plus the prompt's {n} tokens exceed "
                           f"this server's context of {context} tokens (at most {room} new "
                           "tokens fit)", param, code="context_length_exceeded")
        return max_tokens

    # ---- a request's life --------------------------------------------------------------------
    async def create(self, body: protocol.SamplingRequest,
                     headers: Mapping[str, str] | None = None) -> Response:
        """Checks `body` (and the `headers` the server reads: `scope`), submits its job and
        answers with the whole response or a stream."""
        self.check_model(body.model)
        body.check_supported()
        stops = body.stop_strings()
        sampling = self.sampling(body)
        prompt_ids = self.prompt_ids(body)
        max_tokens, param = self.max_tokens(body)
        budget = self.budget(prompt_ids, max_tokens, param, sampling)
        if body.min_tokens > budget:
            raise APIError(400, f"min_tokens={body.min_tokens} exceeds the token budget of "
                           f"{budget} ({param} or what fits the context)", "min_tokens")
        if not self.scheduler.alive:
            raise APIError(503, "the engine is not running", type_="server_error")
        job = Job(prompt_ids=prompt_ids, max_new_tokens=budget, sampling=sampling,
                  loop=asyncio.get_running_loop(), queue=asyncio.Queue(),
                  ignore_eos=body.ignore_eos, min_tokens=body.min_tokens,
                  scope=self.scope(body, sampling, headers))
        gen = Generation(id=self.id_prefix + secrets.token_hex(12), created=int(time.time()),
                         prompt_ids=prompt_ids, job=job,
                         text=OutputText(self.model.tokenizer, stops),
                         include_usage=body.include_usage)
        if body.stream:
            return StreamingResponse(self._stream(gen), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        text, finish = [], None
        async with contextlib.aclosing(self._events(gen)) as events:
            async for delta, reason in events:
                text.append(delta)
                finish = reason or finish
        return Response(self.response(gen, "".join(text), finish).model_dump_json(),
                        media_type="application/json")

    async def _events(self, gen: Generation) -> AsyncIterator[tuple[str, str | None]]:
        """(text delta, finish_reason or None) until the job ends; the job is cancelled
        when a stop string matches or the caller stops listening."""
        self.scheduler.submit(gen.job)
        finished = False
        try:
            while True:
                kind, value = await gen.job.queue.get()
                if kind == "tokens":
                    delta = gen.text.push(value)
                    if gen.text.stopped:
                        self.scheduler.cancel(gen.job, "stop")
                        finished = True
                        yield delta, "stop"
                        return
                    yield delta, None  # "" while text is held back: still a delivery
                else:
                    finished = True
                    if value == "error":
                        raise APIError(500, "the engine failed", type_="server_error")
                    delta = gen.text.finish()
                    yield delta, ("stop" if gen.text.stopped or value == "stop" else "length")
                    return
        finally:
            if not finished:  # the client went away (or the server is stopping)
                self.scheduler.cancel(gen.job)

    async def _stream(self, gen: Generation) -> AsyncIterator[str]:
        for chunk in self.opening_chunks(gen):
            yield sse(chunk, gen.include_usage)
        try:
            async with contextlib.aclosing(self._events(gen)) as events:
                async for delta, finish in events:
                    # a chunk per delivery of tokens, its text "" when all of it is held
                    # back (an unfinished character, a possible stop string), as vLLM's
                    # streams: a client sees every step, not only those that end text
                    if delta or finish is None:
                        yield sse(self.chunk(gen, delta, None), gen.include_usage)
                    if finish is not None:
                        yield sse(self.chunk(gen, None, finish), gen.include_usage)
        except APIError as e:  # the status line is sent: report it in the stream
            yield f"data: {json.dumps(e.body())}\n\n"
        if gen.include_usage:
            yield sse(self.usage_chunk(gen), True)
        yield "data: [DONE]\n\n"
