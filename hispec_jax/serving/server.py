"""`hispec serve`: a model, a decoding method and N slots behind the OpenAI-compatible API.

    build_app(model, method="hispec", slots=8)   # the ASGI app (engines compiled lazily)
    serve(app, host="127.0.0.1", port=8000)      # uvicorn; SIGTERM / Ctrl-C: graceful stop

Two slot engines share the slots' shapes: one greedy (temperature 0), one sampling; each
compiles its programs at first use, or all of them up front with `warmup=True` (one insert
program per prompt bucket 16, 32, ... up to the cache capacity, the rounds loop, cancel),
after which serving compiles nothing (`slots.backend_compiles`).
"""

from __future__ import annotations

import logging
import signal
import sys

from hispec_jax.decoding.generate import MIN_PROMPT_BLOCK, model_name
from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.serving import api_server
from hispec_jax.serving import prompts as prompts_lib
from hispec_jax.serving import slots as slots_lib
from hispec_jax.serving.scheduler import Scheduler
from hispec_jax.serving.stream import make_decoder

log = logging.getLogger("hispec.serve")
DEFAULT_CACHE_LEN = 1024


def build_engines(model, method="ar", *, slots: int = 8, max_cache_len: int | None = None,
                  **method_options) -> dict[bool, slots_lib.SlotEngine]:
    """{greedy: SlotEngine} for greedy (True) and sampling (False) requests. Every request
    stops at EOS and at the chat template's end-of-turn markers."""
    if not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
    capacity = max_cache_len or min(DEFAULT_CACHE_LEN, model.cfg.max_position_embeddings)
    if not 1 <= capacity <= model.cfg.max_position_embeddings:
        raise ValueError(f"max_cache_len={capacity} must be in [1, "
                         f"{model.cfg.max_position_embeddings}] (max_position_embeddings)")
    eos = tuple(model.eos_token_ids)
    if prompts_lib.has_chat_template(model):
        eos = prompts_lib.conversation_ids(model, [{"role": "user", "content": "x"}])[1]
    engines = {}
    for greedy in (True, False):
        decoder, _ = make_decoder(model, method, greedy, method_options)
        if decoder.lookahead() + 2 > capacity:
            raise ValueError(f"max_cache_len={capacity} leaves no room for a prompt and a "
                             f"token with the method's lookahead {decoder.lookahead()}")
        engines[greedy] = slots_lib.SlotEngine(model, decoder, slots=slots, capacity=capacity,
                                               greedy=greedy, eos_ids=eos)
    return engines


def warm_up(engines: dict[bool, slots_lib.SlotEngine]) -> None:
    """Compiles every program serving can need: an insert per prompt bucket, the rounds
    loop and cancel, for both engines."""
    for greedy, engine in engines.items():
        sampling = SamplingParams() if greedy else SamplingParams(temperature=1.0)
        block = MIN_PROMPT_BLOCK
        while True:
            n = min(block, engine.capacity - engine.lookahead - 1)
            engine.insert(0, slots_lib.SlotRequest((0,) * n, 1, sampling))
            while engine.busy[0]:
                engine.generate(1)
            if block >= engine.capacity:
                break
            block = min(2 * block, engine.capacity)
        engine.insert(0, slots_lib.SlotRequest((0,), 1, sampling))
        engine.cancel(0)


def build_app(model, method="ar", *, slots: int = 8, max_cache_len: int | None = None,
              warmup: bool = False, rounds_per_step: int = 1, served_name: str | None = None,
              **method_options):
    """The ASGI app serving `model` with `method` over `slots` slots per engine."""
    engines = build_engines(model, method, slots=slots, max_cache_len=max_cache_len,
                            **method_options)
    if warmup:
        before = slots_lib.backend_compiles()
        warm_up(engines)
        log.info("warm-up compiled %d programs", slots_lib.backend_compiles() - before)
    scheduler = Scheduler(engines, rounds_per_step=rounds_per_step)
    name = served_name or model_name(model)
    return api_server.create_app(model, scheduler, name,
                              method if isinstance(method, str) else "custom")


def serve(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Runs `app` on uvicorn until SIGINT / SIGTERM (in-flight requests get 5 s to end).

    uvicorn shuts down gracefully on SIGTERM and then re-raises the signal to the handler
    that was installed before it; that handler ends the process with exit code 0, since
    SIGTERM is the ordinary way to stop a server."""
    import uvicorn

    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    finally:
        signal.signal(signal.SIGTERM, previous)
