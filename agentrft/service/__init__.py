"""`agentrft serve`: OpenAI's fine-tuning API (files, reinforcement jobs, graders, models,
chat completions) served by agentrft, with a dashboard at `/`.

The official `openai` SDK is the client: point it at `base_url=http://HOST:PORT/v1`.
State lives in SQLite under the data directory, artifacts next to it as files; jobs run in
worker processes (`executor.py`) with the same `train` as `agentrft train`. Nothing here is
imported by `import agentrft`.
"""
