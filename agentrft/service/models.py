"""`/v1/models` and `/v1/chat/completions` of the service: the base model and every
finished fine-tuned model of the caller, served by the same `ChatService` as
`agentrft serve-model`.

    smollm2-135m-instruct                   the base model
    ft:BASE:agentrft:SUFFIX:ID              a succeeded job's final model (its run directory)
    ft:BASE:agentrft:SUFFIX:ID:ckpt-step-N  one of a job's checkpoints

Loaded models are kept (the last `max_loaded`), so only a model's first request pays for
loading it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import OrderedDict
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from agentrft.serve.protocol import RequestError, model_card
from agentrft.service.state import ServiceState, caller, state_of

router = APIRouter()
_CKPT = re.compile(r"^(ft:.+):ckpt-step-(\d+)$")


def base_models() -> list[str]:
    from agentrft.policy.models import DEFAULT_MODEL

    return [DEFAULT_MODEL]


def _not_found(model: str) -> RequestError:
    return RequestError(
        f"The model '{model}' does not exist or you do not have access to it.",
        "model",
        "model_not_found",
        404,
    )


def model_ref(state: ServiceState, model: str, owner: str) -> tuple[str, str | None]:
    """What `agentrft.policy.load.load_policy` loads for `model`: (reference, base)."""
    if model in base_models():
        return model, None
    ckpt = _CKPT.match(model)
    if ckpt:
        job = state.store.job_named(ckpt.group(1), owner)
        path = state.jobs_dir / job["id"] / "checkpoints" / f"step-{ckpt.group(2)}" if job else None
        if job is None or path is None or not path.is_dir():
            raise _not_found(model)
        found = next((p for p in (path / "adapter", path / "model") if p.is_dir()), None)
        if found is None:
            raise _not_found(model)
        return str(found), json.loads(job["request"]).get("model") or base_models()[0]
    job = state.store.job_of_model(model, owner)
    if job is None:
        raise _not_found(model)
    return str(state.jobs_dir / job["id"]), None


class ChatModels:
    """Loaded ChatServices by model id, least recently used dropped first."""

    def __init__(self, max_loaded: int = 2, device: str = "auto", dtype: str = "auto") -> None:
        self.max_loaded = max_loaded
        self.device, self.dtype = device, dtype
        self._loaded: OrderedDict[str, Any] = OrderedDict()
        self._lock = asyncio.Lock()

    async def get(self, model: str, ref: str, base: str | None) -> Any:
        async with self._lock:
            if model in self._loaded:
                self._loaded.move_to_end(model)
                return self._loaded[model]
            from agentrft.policy.load import load_policy
            from agentrft.serve.app import ChatService

            policy = await run_in_threadpool(
                lambda: load_policy(ref, base=base, device=self.device, dtype=self.dtype)
            )
            service = ChatService(policy, model)
            self._loaded[model] = service
            while len(self._loaded) > self.max_loaded:
                self._loaded.popitem(last=False)
            return service

    def close(self) -> None:
        """Fail whatever the loaded models are still decoding (at the server's shutdown)."""
        for service in self._loaded.values():
            service.close()

    def drop(self, model: str) -> None:
        for key in [k for k in self._loaded if k == model or k.startswith(model + ":")]:
            del self._loaded[key]


def _chat(state: ServiceState) -> ChatModels:
    if state.chat is None:
        state.chat = ChatModels()
    return state.chat  # type: ignore[no-any-return]


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    owner = caller(request)
    state = state_of(request)
    cards = [model_card(m, 0) | {"owned_by": "agentrft"} for m in base_models()]
    cards += [
        model_card(r["fine_tuned_model"], r["finished_at"] or r["created_at"])
        | {"owned_by": "user"}
        for r in state.store.models(owner)
    ]
    return {"object": "list", "data": cards}


@router.get("/v1/models/{model:path}")
async def retrieve_model(request: Request, model: str) -> dict[str, Any]:
    owner = caller(request)
    state = state_of(request)
    if model in base_models():
        return model_card(model, 0)
    job = state.store.job_of_model(model, owner)
    if job is None:
        raise _not_found(model)
    return model_card(model, job["finished_at"] or job["created_at"]) | {"owned_by": "user"}


@router.delete("/v1/models/{model:path}")
async def delete_model(request: Request, model: str) -> dict[str, Any]:
    owner = caller(request)
    state = state_of(request)
    if model in base_models():
        raise RequestError(
            f"The base model '{model}' cannot be deleted; only fine-tuned models can.",
            "model",
            "model_not_deletable",
            403,
        )
    if not state.store.delete_model(model, owner):
        raise _not_found(model)
    _chat(state).drop(model)
    return {"id": model, "object": "model", "deleted": True}


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Any:
    from agentrft.serve.app import (
        MAX_BODY_BYTES,
        chat_response,
        parse_body,
        read_body,
        unless_disconnected,
    )

    owner = caller(request)
    state = state_of(request)
    req = await asyncio.to_thread(
        parse_body, await read_body(request, MAX_BODY_BYTES)
    )  # as serve-model: capped, off the loop
    ref, base = model_ref(state, req.model, owner)
    service = await _chat(state).get(req.model, ref, base)
    # as serve-model: a client that hangs up cancels its request, streamed or not
    return await unless_disconnected(request, chat_response(service, req))
