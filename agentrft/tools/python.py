"""In-process Python tools (`"function": "module:callable"`), with the HTTP contract's semantics.

The callable receives the call's arguments as keyword arguments, plus `trace_id` and `item`
when its signature names them. It returns a string (anything else is JSON-encoded).
- `ToolInputError` or `ValueError` plays the part of a 4xx: its message is shown to the model.
- Any other exception plays the part of a 5xx: retried, then the rollout is discarded.
- An output over 1 MiB is refused, as over HTTP.
Async callables are awaited; plain ones run in a worker thread so a turn's calls overlap.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from agentrft.errors import ConfigError, ToolUnavailable
from agentrft.tools.http import MAX_PAYLOAD_BYTES, output_refused
from agentrft.types import ToolCall, ToolResult


class ToolInputError(ValueError):
    """Raise from a tool to tell the model its call was wrong (the 4xx of in-process tools)."""


def import_callable(ref: str, base_dir: str | None = None) -> Callable[..., Any]:
    """Resolve "package.module:attr". `base_dir` (a job's folder) is searched first."""
    import sys

    module_name, _, attr = ref.partition(":")
    added = base_dir is not None and base_dir not in sys.path
    if added:
        sys.path.insert(0, base_dir)  # type: ignore[arg-type]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} for {ref!r}: {exc}") from None
    finally:
        if added:
            sys.path.remove(base_dir)  # type: ignore[arg-type]
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{module_name!r} has no attribute {attr!r} (from {ref!r})")
        obj = getattr(obj, part)
    return obj


class PythonTool:
    """Picklable: holds the reference, imports the callable lazily in each process."""

    def __init__(
        self,
        spec: Any,
        *,
        retries: int,
        backoff_s: float,
        timeout_s: float,
        base_dir: str | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.retries = retries
        self.backoff_s = backoff_s
        self.timeout_s = spec.timeout_s or timeout_s
        self.base_dir = base_dir
        self._fn: Callable[..., Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fn": None}

    def _callable(self) -> Callable[..., Any]:
        if self._fn is None:
            self._fn = import_callable(self.spec.function, self.base_dir)
        return self._fn

    async def _invoke(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await asyncio.wait_for(fn(**kwargs), self.timeout_s)
        return await asyncio.wait_for(asyncio.to_thread(fn, **kwargs), self.timeout_s)

    async def __call__(
        self, call: ToolCall, trace_id: str, item: Mapping[str, Any], client: Any = None
    ) -> ToolResult:
        fn = self._callable()
        kwargs = json.loads(call.arguments)
        params = inspect.signature(fn).parameters
        if "trace_id" in params:
            kwargs["trace_id"] = trace_id
        if "item" in params:
            kwargs["item"] = dict(item)
        t0 = time.perf_counter()
        reason = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                out = await self._invoke(fn, dict(kwargs))
            except ValueError as exc:  # ToolInputError included: the model's fault
                return ToolResult(
                    call.call_id,
                    call.name,
                    f"Error: {exc}",
                    "client_error",
                    time.perf_counter() - t0,
                    attempt + 1,
                )
            except TimeoutError:
                reason = f"timed out after {self.timeout_s:g}s"
                continue
            except Exception as exc:  # the tool's fault: retry like a 5xx
                reason = f"{type(exc).__name__}: {exc}"
                continue
            text = out if isinstance(out, str) else json.dumps(out, ensure_ascii=False, default=str)
            if len(text.encode()) > MAX_PAYLOAD_BYTES:
                return output_refused(call, time.perf_counter() - t0, attempt + 1)
            return ToolResult(
                call.call_id, call.name, text, "ok", time.perf_counter() - t0, attempt + 1
            )
        raise ToolUnavailable(
            f"tool {call.name!r} ({self.spec.function}): {reason} (after {self.retries + 1} attempts)"
        )
