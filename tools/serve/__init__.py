"""`day0 serve`: an OpenAI-compatible inference service on the Engine.

server.py    load the artifact, start uvicorn (the `day0 serve` command)
app.py       the HTTP routes, request ids, SSE streaming, disconnects
protocol.py  request bodies (pydantic, strict) and OpenAI's error object
generate.py  one request's tokens -> text, logprobs and latencies
text.py      incremental detokenization and stop strings
chat.py      the checkpoint's chat template (jinja2, as transformers renders it)
worker.py    the engine thread: continuous batching, admission control (429)
metrics.py   Prometheus metrics
logs.py      structured JSON logs, a level per layer
"""
