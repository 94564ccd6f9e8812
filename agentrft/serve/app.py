"""`agentrft serve-model`: one policy behind `POST /v1/chat/completions` and `GET /v1/models`.

A transformers policy is served by continuous batching (`serve.scheduler`): one thread
decodes every running request together, a request that arrives mid-decode joins the batch
at the next step, and each token goes to its request as it is sampled, which is what
`stream=true` sends (OpenAI's `chat.completion.chunk` events, `serve.stream_text` deciding
when a piece of text is certain). Non-streamed requests go through the same scheduler.
Any other policy (one with only `sample`, as in the unit tests) is served by the rollout
engine's `BatchedSampler`: whole replies, so its stream's content comes at the end.

Parsing and tokenizing run in worker threads, so the event loop keeps answering (`/health`
included) while a huge prompt is tokenized. Bodies over `max_body_bytes` (16 MiB) get 413;
past `max_queued_tokens` (n x max_tokens over all requests) a request gets 429
(`serve.admission`). A client that hangs up cancels its request, streamed or not, within a
decode step. On SIGTERM the server stops taking connections, lets in-flight requests finish
for up to `drain_s` seconds, then cancels the rest and exits.

`tool_choice` "required" or a named function, and `strict: true` tools, are enforced by
grammar-constrained decoding (`policy.constrain`): such a reply is always a schema-valid call
unless it runs out of max_tokens.
A request's `seed` gives each of its choices its own random stream, so a seeded request
gets the same reply however it was batched (within floating-point rounding: see the
scheduler).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentrft.policy import Completion, SamplingParams
from agentrft.policy.constrain import ConstraintError
from agentrft.policy.models import DEFAULT_MODEL
from agentrft.rollout.batching import BatchedSampler
from agentrft.rollout.context import ChatRenderer
from agentrft.serve.admission import MAX_QUEUED_TOKENS, Reply, TokenBudget
from agentrft.serve.protocol import (
    ChatRequest,
    ChunkWriter,
    RequestError,
    ToolUse,
    choice,
    completion_body,
    model_card,
    parse_request,
    template_messages,
    tool_use,
    usage_body,
)
from agentrft.serve.request_log import RequestLog
from agentrft.serve.stream_text import ReplyText
from agentrft.types import Item

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 16 << 20
DRAIN_S = 10.0  # after SIGTERM, how long in-flight requests may run before they are cancelled


@dataclass(frozen=True)
class Prepared:
    """A request read into what sampling needs."""

    prompt: list[int]
    tools: ToolUse
    max_new: int
    params: SamplingParams
    seeds: list[int | None]


class ChatService:
    """Turns chat requests into sampling on one policy (anything with the Policy protocol:
    `tokenizer`, `stop_token_ids`, `context_window`, `sample`). `continuous` (default: when
    the policy can decode step by step, as HFPolicy can) serves it by continuous batching;
    otherwise concurrent requests are batched whole. `max_batch` bounds the rows decoded
    together either way."""

    def __init__(
        self,
        policy: Any,
        model_name: str,
        *,
        max_batch: int = 32,
        default_max_tokens: int = 512,
        continuous: bool | None = None,
        max_queued_tokens: int = MAX_QUEUED_TOKENS,
    ) -> None:
        ChatRenderer(policy.tokenizer)  # refuses a tokenizer without a chat template, at start
        self.policy = policy
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens
        if continuous is None:
            continuous = callable(getattr(policy, "forward_last", None))
        self.scheduler: Any = None
        self.sampler: BatchedSampler | None = None
        if continuous:
            from agentrft.serve.scheduler import DecodeScheduler  # loads torch

            self.scheduler = DecodeScheduler(policy, max_running=max_batch)
        else:
            self.sampler = BatchedSampler(policy, SamplingParams(), max_batch, gather_s=0.005)
        self.budget = TokenBudget(max_queued_tokens)
        self.created = int(time.time())
        self.max_token_chars = _longest_token(policy.tokenizer)

    def close(self) -> None:
        """Fail whatever is still queued or decoding and let the decoding thread end."""
        if self.scheduler is not None:
            self.scheduler.close()

    def prompt(self, req: ChatRequest, specs: Any, prefill: str) -> list[int]:
        renderer = ChatRenderer(self.policy.tokenizer, specs)
        _, ctx = renderer.initial(Item(0, tuple(template_messages(req.messages)), {}, "request"))
        return ctx.tokens + (renderer.prefill_tokens(prefill) if prefill else [])

    def reply_text(self, completion: Completion, prefill: str) -> str:
        """The reply as OpenAI returns it: prefill included, stop token and stop string not."""
        text = self.policy.tokenizer.decode(
            list(completion.reply_tokens), skip_special_tokens=False
        )
        if completion.stop_text:
            text = text[: text.find(completion.stop_text)] if completion.stop_text in text else text
        return prefill + text

    def start(self, p: Prepared) -> Reply:
        """Queue `p` now (RequestError 429 when the server is full) and return its events:
        (choice, token id) as tokens are sampled (continuous batching only), then (choice,
        Completion) as each choice ends. Closing it early cancels the request."""
        held = self.budget.reserve(len(p.seeds) * p.max_new)
        try:
            if self.scheduler is not None:
                from agentrft.serve.scheduler import SchedulerClosed

                try:
                    return Reply(self.scheduler.generate(p.prompt, p.params, p.seeds), held)
                except SchedulerClosed as exc:
                    raise RequestError(str(exc), None, "shutting_down", 503) from None
            return Reply(self._whole_replies(p), held)
        except BaseException:
            held.release()
            raise

    async def _whole_replies(self, p: Prepared) -> AsyncIterator[tuple[int, int | Completion]]:
        assert self.sampler is not None
        completions = await asyncio.gather(
            *(self.sampler.sample(p.prompt, p.max_new, seed, p.params) for seed in p.seeds)
        )
        for i, c in enumerate(completions):
            yield i, c

    async def complete(self, req: ChatRequest) -> dict[str, Any]:
        """The `chat.completion` body for `req` (raises RequestError for a bad request)."""
        p = await asyncio.to_thread(self.prepare, req)  # tokenizing a long prompt takes seconds
        t0 = time.perf_counter()
        completions: dict[int, Completion] = {}
        async with contextlib.aclosing(self.start(p)) as events:
            async for i, event in events:
                if isinstance(event, Completion):
                    completions[i] = event
        done = [completions[i] for i in range(len(p.seeds))]
        choices = [
            choice(i, self.reply_text(c, p.tools.prefill), c, p.tools) for i, c in enumerate(done)
        ]
        sampled = sum(len(c.tokens) for c in done)
        log.info(
            "n=%d prompt=%d sampled=%d in %.2fs",
            req.n,
            len(p.prompt),
            sampled,
            time.perf_counter() - t0,
        )
        return completion_body(self.model_name, choices, len(p.prompt), sampled)

    async def stream(
        self, req: ChatRequest, p: Prepared, reply: Reply
    ) -> AsyncGenerator[dict[str, Any], None]:
        """`req`'s chunk events from its started `reply`, each choice's content as it
        becomes certain."""
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        out = ChunkWriter(self.model_name, include_usage)
        texts = [
            ReplyText(
                self.policy.tokenizer,
                prefill=p.tools.prefill,
                stops=p.params.stop,
                parse_tools=p.tools.parse,
                stop_token_ids=self.policy.stop_token_ids,
            )
            for _ in p.seeds
        ]
        sampled = 0
        async with contextlib.aclosing(reply) as events:
            for i in range(len(p.seeds)):
                yield out.role(i)
            async for i, event in events:
                if isinstance(event, Completion):
                    sampled += len(event.tokens)
                    done = choice(i, self.reply_text(event, p.tools.prefill), event, p.tools)
                    rest = texts[i].finish(done["message"]["content"] or "")
                    if rest:
                        yield out.content(i, rest)
                    for chunk in out.end(i, done):
                        yield chunk
                elif piece := texts[i].add(event):
                    yield out.content(i, piece)
        if include_usage:
            yield out.usage(usage_body(len(p.prompt), sampled))

    def prepare(self, req: ChatRequest) -> Prepared:
        """Check and tokenize a request (blocking: call it from a worker thread). Anything
        the request's fields make fail is the request's fault: a 400, never a 500."""
        try:
            return self._prepare(req)
        except RequestError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            log.warning("malformed request", exc_info=True)
            raise RequestError(f"malformed request: {type(exc).__name__}: {exc}") from None

    def _prepare(self, req: ChatRequest) -> Prepared:
        if req.model != self.model_name:
            raise RequestError(
                f"The model {req.model!r} does not exist here: this server serves {self.model_name!r}",
                "model",
                "model_not_found",
                404,
            )
        tools = tool_use(req)
        chars = sum(len(m["content"]) for m in template_messages(req.messages))
        if self.max_token_chars and chars > self.policy.context_window * self.max_token_chars:
            # no token covers more than max_token_chars characters: it cannot fit, so do not
            # spend seconds tokenizing it to find out
            raise RequestError(
                f"This model's maximum context length is {self.policy.context_window} tokens. However, the messages "
                f"take at least {chars // self.max_token_chars} tokens ({chars} characters). Shorten the messages.",
                "messages",
                "context_length_exceeded",
            )
        prompt = self.prompt(req, tools.specs, tools.prefill)
        room = self.policy.context_window - len(prompt)
        asked = req.requested_max_tokens
        if room < 1 or (asked is not None and asked > room):
            raise RequestError(
                f"This model's maximum context length is {self.policy.context_window} tokens. However, the messages "
                f"take {len(prompt)} tokens"
                + (f" and {asked} were requested for the reply" if asked else "")
                + ". Shorten the messages or lower max_tokens.",
                "messages",
                "context_length_exceeded",
            )
        max_new = asked if asked is not None else min(self.default_max_tokens, room)
        if tools.grammar is not None and hasattr(self.policy, "row_rules"):
            rules = self.policy.row_rules()  # compile now: a schema it cannot enforce is a 400
            try:
                tools.grammar.compiled(rules.tokenizer, rules.vocab_size, rules.stop_token_ids)
            except ConstraintError as exc:
                raise RequestError(str(exc), "tools") from None
        params = SamplingParams(
            temperature=req.temperature,
            top_p=req.top_p,
            max_tokens=max_new,
            stop=req.stop_strings,
            min_tokens=req.min_tokens,
            constraint=tools.grammar,
        )
        seeds: list[int | None] = [
            None if req.seed is None else choice_seed(req.seed, i) for i in range(req.n)
        ]
        return Prepared(prompt, tools, max_new, params, seeds)


def _longest_token(tokenizer: Any) -> int:
    """The most characters one token of `tokenizer` stands for (0: unknown)."""
    try:
        return max(len(tokenizer.convert_tokens_to_string([t])) for t in tokenizer.get_vocab())
    except Exception:  # a tokenizer without a vocabulary to list: always tokenize
        return 0


def choice_seed(seed: int, index: int) -> int:
    """The random stream of choice `index` of a request with `seed`: its own, so the reply
    is the same whatever else is batched with it, and choices differ from each other.
    Kept within a non-negative int64, which every generator accepts."""
    return (seed * 1_000_003 + index * 104_729) % (1 << 63)


def parse_body(raw: bytes) -> ChatRequest:
    """The request in a raw body (blocking for a large one: call it from a worker thread)."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    return parse_request(body)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 RequestError as soon as it is known to pass `limit` bytes."""
    declared = request.headers.get("content-length")
    too_large = RequestError(
        f"the request body is over the {limit >> 20} MiB limit", None, "request_too_large", 413
    )
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def chat_response(service: ChatService, req: ChatRequest) -> Any:
    """The reply to a parsed request: the `chat.completion` JSON, or for `stream=true` its
    chunk events as they are sampled. Errors come before any chunk, as plain JSON."""
    if not req.stream:
        return await service.complete(req)
    p = await asyncio.to_thread(service.prepare, req)
    reply = service.start(p)  # a 429 comes here, before any chunk
    return StreamingResponse(sse(service.stream(req, p, reply)), media_type="text/event-stream")


async def until_disconnected(request: Request) -> None:
    """Return once the client has hung up (its body already read, the next ASGI message a
    connection can send is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Any) -> Any:
    """Await the coroutine `work`, cancelling it as soon as the client hangs up (then the
    response is a bare 499 that nobody reads). A streamed reply notices on its own, at its
    next chunk; this is what stops a non-streamed one."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        log.info("client hung up: request cancelled")
        return Response(status_code=499)
    finally:
        for t in (task, gone):
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def sse(chunks: AsyncGenerator[dict[str, Any], None]) -> AsyncGenerator[bytes, None]:
    """Server-sent events: `data: <json>` per chunk, then `data: [DONE]`. Closing it (the
    client went away) closes `chunks`, which cancels the request's decoding."""
    async with contextlib.aclosing(chunks):
        async for c in chunks:
            yield b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def create_app(
    policy: Any,
    model_name: str,
    *,
    max_batch: int = 32,
    default_max_tokens: int = 512,
    max_body_bytes: int = MAX_BODY_BYTES,
    continuous: bool | None = None,
    max_queued_tokens: int = MAX_QUEUED_TOKENS,
    request_log: RequestLog | None = None,
) -> FastAPI:
    """The FastAPI app. `model_name` is the one id requests must name (`GET /v1/models`);
    `continuous`: see ChatService; `request_log`: where each served request is logged
    (opt-in, redacted). Its shutdown fails whatever is still decoding."""
    service = ChatService(
        policy,
        model_name,
        max_batch=max_batch,
        default_max_tokens=default_max_tokens,
        continuous=continuous,
        max_queued_tokens=max_queued_tokens,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(service.close)
        if request_log is not None:
            request_log.close()

    app = FastAPI(title="agentrft serve-model", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.service = service

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(model_name, service.created)]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        if model_id != model_name:
            raise RequestError(
                f"The model {model_id!r} does not exist here: this server serves {model_name!r}",
                "model",
                "model_not_found",
                404,
            )
        return model_card(model_name, service.created)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        req = await asyncio.to_thread(parse_body, await read_body(request, max_body_bytes))
        reply = await unless_disconnected(request, chat_response(service, req))
        if request_log is not None:
            body = reply if isinstance(reply, dict) else None
            await asyncio.to_thread(
                request_log.write, req.model, req.messages, req.tools, req.stream, body
            )
        return reply

    return app


def served_name(ref: str) -> str:
    """The id clients name in `model`: the default model's name, or the folder's name."""
    if ref == "base":
        return DEFAULT_MODEL
    path = Path(ref).expanduser()
    return path.resolve().name if path.exists() else ref


def serve_model(
    ref: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    base: str | None = None,
    name: str | None = None,
    max_batch: int = 32,
    default_max_tokens: int = 512,
    device: str = "auto",
    dtype: str = "auto",
    max_body_bytes: int = MAX_BODY_BYTES,
    max_queued_tokens: int = MAX_QUEUED_TOKENS,
    drain_s: float = DRAIN_S,
    request_log: str | None = None,
) -> None:
    """Load `ref` (see `agentrft.policy.load`) and serve it until interrupted. On SIGTERM or
    Ctrl-C, in-flight requests get `drain_s` seconds to finish, then are cancelled.
    `request_log`: a JSONL file each request is appended to, redacted (`agentrft doctor
    --traffic` reads it)."""
    import uvicorn

    from agentrft.policy.load import load_policy

    policy = load_policy(ref, base=base, device=device, dtype=dtype)
    model_name = name or served_name(ref)
    app = create_app(
        policy,
        model_name,
        max_batch=max_batch,
        default_max_tokens=default_max_tokens,
        max_body_bytes=max_body_bytes,
        max_queued_tokens=max_queued_tokens,
        request_log=None if request_log is None else RequestLog(request_log),
    )
    print(
        f"serving {model_name!r} ({ref}) on http://{host}:{port}/v1  (OpenAI-compatible chat completions)",
        flush=True,
    )
    print(f"precision: {policy.precision}", flush=True)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=max(round(drain_s), 1),
    )
