"""Judges: the models behind `score_model` and `label_model` graders.

A `Judge` completes a chat and returns text. Two implementations:
- `LocalJudge`: a transformers model in this process (`HFPolicy`), e.g. the embedded
  `smollm2-135m-instruct` or any local model directory / .gguf. Concurrent calls are batched.
- `EndpointJudge`: any OpenAI-compatible `POST {base_url}/chat/completions` (OpenAI, vLLM,
  llama.cpp, agentrft's own server), with the shared retry rule: 5xx, timeouts and
  malformed replies are retried, then `GraderUnavailable` (the sample is discarded).

Configuration: a `judge` block under the job's `agentrft:` key (or `build_grader(...,
judge=...)`, or the `agentrft grader run --judge-*` flags):

    agentrft:
      judge:
        base_url: http://127.0.0.1:8000/v1     # omit to judge locally
        api_key_env: OPENAI_API_KEY            # the *name* of the variable holding the key
        model: smollm2-135m-instruct           # use this for every model grader ...
        models: {o4-mini-2025-04-16: qwen2.5-7b-instruct}   # ... or map grader models
        structured_output: true                # send OpenAI's response_format json_schema
        prefill: '{"result": '                 # local judges: a fixed start of the reply
        timeout_s: 60
        retries: 3

The grader's own `model` is used when neither `model` nor `models` says otherwise, so an
OpenAI grader JSON runs unchanged against OpenAI (base_url https://api.openai.com/v1).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field

from agentrft.errors import ConfigError, GraderUnavailable
from agentrft.graders.protocol import pooled_client
from agentrft.graders.spec import Strict
from agentrft.redact import redact_url


class JudgeConfig(Strict):
    """agentrft's judge settings (the `agentrft.judge` block of a job)."""

    base_url: str | None = None
    api_key_env: str | None = None
    model: str | None = None
    models: dict[str, str] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    structured_output: bool = True
    timeout_s: float = Field(default=60.0, gt=0)
    retries: int = Field(default=3, ge=0)
    backoff_s: float = Field(default=0.5, ge=0)
    max_tokens: int = Field(default=256, ge=1)  # local judges, when sampling_params sets none
    # Local judges only: a fixed start of every judge reply, inserted, not sampled. A small
    # model that will not follow the JSON instruction still completes `{"result": ` with a
    # number, at the cost of writing no reasoning steps first.
    prefill: str | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "fp32", "bf16"] = "auto"

    def model_for(self, grader_model: str) -> str:
        return self.model or self.models.get(grader_model, grader_model)


@dataclass(frozen=True)
class JudgeParams:
    temperature: float | None = None  # None: the endpoint's default; greedy for local judges
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    reasoning_effort: str | None = None


@dataclass(frozen=True)
class JudgeReply:
    text: str
    refusal: str | None = None
    tokens: int = 0


class JudgeError(Exception):
    """A judge call that failed in a way the grader reports with `flag`."""

    def __init__(self, flag: str, details: str) -> None:
        super().__init__(details)
        self.flag = flag


class Judge(Protocol):
    model: str

    async def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        params: JudgeParams,
        response_format: Mapping[str, Any] | None = None,
    ) -> JudgeReply:
        """The judge's reply. Raises JudgeError or GraderUnavailable on failure."""
        ...


class EndpointJudge:
    """An OpenAI-compatible chat endpoint. Picklable (the HTTP client is per event loop)."""

    def __init__(self, config: JudgeConfig, model: str) -> None:
        assert config.base_url
        self.config = config
        self.model = model
        self.url = config.base_url.rstrip("/") + "/chat/completions"

    def _headers(self) -> dict[str, str]:
        headers = dict(self.config.headers)
        if self.config.api_key_env:
            key = os.environ.get(self.config.api_key_env)
            if key:
                headers["authorization"] = f"Bearer {key}"
        return headers

    async def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        params: JudgeParams,
        response_format: Mapping[str, Any] | None = None,
    ) -> JudgeReply:
        from agentrft.tools.http import post_with_retries

        body: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in messages]}
        for key, value in (
            ("temperature", params.temperature),
            ("top_p", params.top_p),
            ("seed", params.seed),
            ("max_completion_tokens", params.max_tokens),
            ("reasoning_effort", params.reasoning_effort),
        ):
            if value is not None:
                body[key] = value
        if response_format is not None and self.config.structured_output:
            body["response_format"] = dict(response_format)
        async with pooled_client() as client:
            reply = await post_with_retries(
                client,
                self.url,
                json.dumps(body).encode(),
                headers=self._headers(),
                timeout=self.config.timeout_s,
                retries=self.config.retries,
                backoff_s=self.config.backoff_s,
                error_cls=GraderUnavailable,
                validate=_chat_message,
            )
        if reply.status >= 400:
            hint = (
                " (if it rejects response_format, set agentrft.judge.structured_output: false)"
                if reply.status == 400
                else ""
            )
            raise JudgeError(
                "model_grader_server_error",
                f"{redact_url(self.url)}: HTTP {reply.status}: {reply.body[:300].decode('utf-8', 'replace')}{hint}",
            )
        obj = json.loads(reply.body)
        message = _chat_message(reply.body)
        usage = obj.get("usage") or {}
        return JudgeReply(
            message.get("content") or "",
            message.get("refusal"),
            int(usage.get("total_tokens") or 0),
        )


def _chat_message(data: bytes) -> dict[str, Any]:
    """choices[0].message of a chat completion; ValueError (so it is retried) otherwise."""
    try:
        obj = json.loads(data)
        message = obj["choices"][0]["message"]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError):
        raise ValueError(
            'expected a chat completion: {"choices": [{"message": {"content": ...}}]}'
        ) from None
    if not isinstance(message, dict):
        raise ValueError("choices[0].message is not an object")
    return message


class LocalJudge:
    """A transformers model in this process. The model loads on first use; concurrent calls
    with the same sampling settings share batches. Picklable (it reloads in a new process)."""

    def __init__(self, config: JudgeConfig, model: str) -> None:
        self.config = config
        self.model = model
        self._policy: Any = None
        self._samplers: dict[Any, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_policy": None, "_samplers": {}}

    def _load(self) -> Any:
        if self._policy is None:
            from agentrft.policy.hf import HFPolicy

            self._policy = HFPolicy.load(self.model, self.config.device, self.config.dtype)
        return self._policy

    async def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        params: JudgeParams,
        response_format: Mapping[str, Any] | None = None,
    ) -> JudgeReply:
        from agentrft.policy import SamplingParams
        from agentrft.rollout.batching import BatchedSampler

        policy = await asyncio.to_thread(self._load)
        tok = policy.tokenizer
        text = tok.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
        )
        prefill = self.config.prefill or ""
        ids = tok.encode(text + prefill, add_special_tokens=False)
        room = policy.context_window - len(ids)
        if room < 1:
            raise JudgeError(
                "model_grader_parse_error",
                f"the judge prompt ({len(ids)} tokens) does not fit the judge's context ({policy.context_window})",
            )
        sp = SamplingParams(
            temperature=params.temperature if params.temperature is not None else 0.0,
            top_p=params.top_p if params.top_p is not None else 1.0,
            max_tokens=params.max_tokens or self.config.max_tokens,
            seed=params.seed,
        )
        loop = asyncio.get_running_loop()
        owner, sampler = self._samplers.get(sp, (None, None))
        if owner is not loop:  # a sampler's worker lives in one event loop
            sampler = BatchedSampler(policy, sp, max_batch=16)
            self._samplers[sp] = (loop, sampler)
        completion = await sampler.sample(ids, min(sp.max_tokens, room))
        out = prefill + tok.decode(list(completion.tokens), skip_special_tokens=True)
        return JudgeReply(out, None, len(ids) + len(completion.tokens))


def is_local_model(name: str) -> bool:
    from agentrft.policy.models import DEFAULT_MODEL

    return name == DEFAULT_MODEL or Path(name).expanduser().exists()


def make_judge(
    config: JudgeConfig | Mapping[str, Any] | None,
    grader_model: str,
    where: str,
    check: bool,
    cache: dict[Any, Any],
) -> Judge:
    """The judge for one model grader; judges are shared within one grader tree."""
    cfg = (
        config
        if isinstance(config, JudgeConfig)
        else JudgeConfig.model_validate(dict(config or {}))
    )
    model = cfg.model_for(grader_model)
    key = (cfg.base_url, model)
    if key in cache:
        return cache[key]
    if cfg.base_url:
        if check and cfg.api_key_env and not os.environ.get(cfg.api_key_env):
            raise ConfigError(
                f"{where}: the judge endpoint's API key is read from ${cfg.api_key_env}, which is not set; export it or drop agentrft.judge.api_key_env"
            )
        judge: Judge = EndpointJudge(cfg, model)
    else:
        if check and not is_local_model(model):
            raise ConfigError(
                f"{where}: model {model!r} is not available locally. Either judge through an OpenAI-compatible endpoint "
                f"(agentrft.judge.base_url) or name a local judge (agentrft.judge.model: smollm2-135m-instruct, a model directory or a .gguf)"
            )
        judge = LocalJudge(cfg, model)
    cache[key] = judge
    return judge
