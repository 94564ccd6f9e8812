"""Serving: a base model or a trained checkpoint behind an OpenAI-compatible chat endpoint.

`protocol.py` reads requests and writes replies in OpenAI's chat-completions shapes;
`app.py` is the FastAPI app that batches concurrent requests into one sampling call.
Nothing here is imported by `import agentrft`.
"""
