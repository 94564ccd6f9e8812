"""Serving: a base model or a trained checkpoint behind an OpenAI-compatible chat endpoint.

    protocol.py       OpenAI's chat-completions shapes: requests, replies, stream chunks, errors
    app.py            the FastAPI app (`agentrft serve-model`): prepare a request, reply or stream
    scheduler.py      continuous batching: one thread decodes every running request together
    running_batch.py  the rows being decoded, as a KV-cached batch that rows join and leave
    stream_text.py    when a streamed piece of text is certain enough to send

Nothing here is imported by `import agentrft`.
"""
