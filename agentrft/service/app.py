"""The service's FastAPI app: OpenAI's fine-tuning API for the reinforcement method.

    /v1/files                                 files.py
    /v1/fine_tuning/jobs[/...]                jobs.py (runs on executor.py's workers)
    /v1/fine_tuning/alpha/graders/{run,validate}  graders.py
    /v1/models, /v1/chat/completions          models.py
    /                                         dashboard.py

Every error is OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`; bad
input is a 4xx, never a 500.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from agentrft.errors import ConfigError
from agentrft.serve.protocol import RequestError
from agentrft.service.executor import LocalExecutor
from agentrft.service.secret_store import SecretStore
from agentrft.service.state import ServiceState
from agentrft.service.store import Store

log = logging.getLogger(__name__)


def create_app(
    data_dir: str | Path,
    *,
    api_keys: frozenset[str] = frozenset(),
    workers: int = 1,
    worker_module: str = "agentrft.service.worker",
    poll_s: float = 0.5,
    executor: str = "local",
    ray_address: str | None = None,
) -> FastAPI:
    """The app over `data_dir` (created if missing). Workers start with the app's lifespan
    and stop with it; jobs left running resume on the next start. `executor` is "local"
    (worker processes here) or "ray" (Ray tasks, `ray_address` or a local Ray)."""
    from agentrft.service import dashboard, files, graders, jobs, models

    data = Path(data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o700)  # uploaded datasets and the database: the server's user only
    secrets = SecretStore.open(data)  # first, so a wrong key stops the start
    store = Store(data / "service.db")
    options: dict[str, Any] = {
        "secrets": secrets,
        "workers": workers,
        "worker_module": worker_module,
        "poll_s": poll_s,
        "validate_files": jobs.validate_job_files(data / "jobs"),
    }
    if executor == "ray":
        from agentrft.service.ray_executor import RayExecutor

        runner: LocalExecutor = RayExecutor(store, data / "jobs", address=ray_address, **options)
    elif executor == "local":
        runner = LocalExecutor(store, data / "jobs", **options)
    else:
        raise ConfigError(f"unknown executor {executor!r}: local or ray")
    state = ServiceState(data, store, runner, api_keys, secrets)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runner.start()
        try:
            yield
        finally:
            if state.chat is not None:
                await asyncio.to_thread(state.chat.close)
            runner.shutdown()
            store.close()

    app = FastAPI(
        title="agentrft service", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.service = state

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in err["loc"][1:]) or None
        return JSONResponse(
            RequestError(
                f"{param}: {err['msg']}" if param else str(err["msg"]), param, "invalid_value"
            ).body(),
            status_code=400,
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = (
            f"Unknown request URL: {request.method} {request.url.path}"
            if exc.status_code in (404, 405)
            else str(exc.detail)
        )
        code = "unknown_url" if exc.status_code in (404, 405) else None
        return JSONResponse(
            RequestError(message, None, code, exc.status_code).body(), status_code=exc.status_code
        )

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(
            RequestError(
                f"The server had an error processing your request ({type(exc).__name__}).",
                None,
                "server_error",
                500,
            ).body(),
            status_code=500,
        )

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    for module in (files, jobs, graders, models, dashboard):
        app.include_router(module.router)
    return app
