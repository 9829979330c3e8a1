"""Serving: engine slots (continuous batching), streaming text, the interactive chat and
the OpenAI-compatible HTTP server (docs/serving.md).

    slots.py      SlotEngine: insert a request into a free slot, run a bounded number of
                  rounds, hand out each slot's new tokens
    detok.py      incremental detokenization (only the stable prefix of the text)
    stream.py     generate_stream: text deltas as tokens are accepted
    prompts.py    conversations as prompts (chat template, or a plain transcript)
    chat_loop.py  `hispec chat`
    scheduler.py  the engine thread: requests -> slots -> token streams
    api.py        the ASGI app (/v1/chat/completions, /v1/completions, /v1/models, /health)
    server.py     the slot engines, warm-up, uvicorn (`hispec serve`)

The command-line side is `cli/serving.py` (chat, serve) and `cli/generate.py` (--stream).
"""
