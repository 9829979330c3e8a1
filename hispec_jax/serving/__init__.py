"""Serving: streaming text, the interactive chat and the OpenAI-compatible HTTP server
(docs/serving.md), on the slot engine (`decoding/slots.py`: continuous batching).

    detok.py               incremental detokenization (a short window per step; only text
                           later tokens cannot change)
    stream.py              generate_stream: text deltas as tokens are accepted;
                           warm_up_stream: compile what a stream runs, ahead of it
    prompts.py             conversations as prompts (chat template, or a plain transcript)
    chat_loop.py           `hispec chat` (compiles what its answers run while it starts)
    scheduler.py           the engine thread: warm-up, requests -> slots (a prefill chunk
                           between decode steps) -> token streams
    metrics.py             what the engine thread counts; /metrics (Prometheus text format)
    protocol.py            the API's request / response bodies and request checks
    serving_engine.py      a request -> a job -> text (stop strings) -> JSON or SSE
    serving_chat.py        /v1/chat/completions
    serving_completion.py  /v1/completions
    api_server.py          create_app: the FastAPI app and its routes (/health, /metrics)
    server.py              the default plan, the slot engines, warm-up, uvicorn (`hispec serve`)

The command-line side is `cli/serving.py` (chat, serve) and `cli/generate.py` (--stream).
"""
