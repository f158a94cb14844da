"""The inference routes: /v1/completions, /v1/chat/completions (JSON or SSE) and /v1/embeddings.

Each handler: parse and validate (400), check the model and the server state (404/503), tokenize and
check the context (400), then either answer from the completion cache or admit the request (429 when
the queue is full) and run it. Streaming sends headers only once the first text is ready, so every
rejection still arrives as a proper status code; after that, failures arrive as an SSE error event.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from preheat_server.generation.async_engine import EngineDeadError, EngineStepError, QueueFullError
from preheat_server.generation.service import (
    Delta,
    Generation,
    GenerationRequest,
    GenerationService,
    InvalidRequestError,
)
from preheat_server.http.context import CONTEXT, ServerContext
from preheat_server.http.errors import APIError, bad_request, from_validation_error
from preheat_server.http.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from preheat_server.sampling import TokenLogprob

log = logging.getLogger(__name__)

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGoneError(Exception):
    """The client closed the connection mid-stream (its request was aborted in the engine)."""


def _outcome(exc: BaseException | None) -> str:
    if exc is None:
        return "success"
    if isinstance(exc, APIError):
        return {429: "queue_full", 503: "unavailable"}.get(exc.status, "invalid" if exc.status < 500 else "error")
    if isinstance(exc, ClientGoneError | asyncio.CancelledError | ConnectionResetError):
        return "cancelled"
    if isinstance(exc, web.HTTPException):
        return "invalid" if exc.status < 500 else "error"
    return "error"


def inference_route(api: str) -> Callable[[Callable[..., Awaitable[web.StreamResponse]]], Any]:
    """Count the arrival and the outcome of every request; map service errors to HTTP ones."""

    def wrap(fn: Callable[[web.Request, ServerContext], Awaitable[web.StreamResponse]]) -> Any:
        @functools.wraps(fn)
        async def handler(request: web.Request) -> web.StreamResponse:
            ctx = request.app[CONTEXT]
            m = ctx.metrics
            m.requests_received.labels(m.model_name, api).inc()
            error: BaseException | None = None
            ctx.request_started()
            try:
                return await fn(request, ctx)
            except InvalidRequestError as exc:
                error = bad_request(str(exc), param=exc.param, code=exc.code)
                raise error from exc
            except QueueFullError as exc:
                error = APIError(429, f"The server is at capacity: {exc}. Retry after the Retry-After delay.",
                                 type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
                raise error from exc
            except EngineDeadError as exc:
                error = APIError(503, f"The engine is not available: {exc}", type="service_unavailable",
                                 code="engine_unavailable")
                raise error from exc
            except EngineStepError as exc:
                error = APIError(500, str(exc), type="internal_error", code="engine_step_failed")
                raise error from exc
            except ValueError as exc:    # the engine's own verdict on a request it cannot take
                error = bad_request(str(exc))
                raise error from exc
            except ClientGoneError as exc:
                error = exc
                return web.Response(status=499)   # nobody reads it; aiohttp needs a response object
            except BaseException as exc:
                error = exc
                raise
            finally:
                ctx.request_finished()
                m.requests.labels(m.model_name, api, _outcome(error)).inc()

        return handler

    return wrap


async def _read_json(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        raise bad_request("The request body is empty; send a JSON object.", code="invalid_json")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}.", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    return body


def _validate(model: type[BaseModel], body: dict) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from exc


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


# ---- completions ----

@inference_route("completions")
async def completions(request: web.Request, ctx: ServerContext) -> web.StreamResponse:
    body = await _read_json(request)
    req: CompletionRequest = _validate(CompletionRequest, body)
    service = ctx.require_generation(req.model)
    n = req.choices_per_prompt()
    lp = req.logprobs
    prompts = req.prompts()
    # One engine request per (prompt, choice), index = prompt * n + choice, as OpenAI numbers them.
    greqs: list[GenerationRequest] = []
    echoes: list[str] = []
    for prompt in prompts:
        ids = service.encode_prompt(prompt)
        greq = _build(service, req, ids, chat=False, max_tokens=req.max_tokens, prefix="cmpl",
                      logprobs=lp, prompt_logprobs=lp if req.echo else None)
        greqs += service.copies(greq, n, "cmpl")
        echo = (prompt if isinstance(prompt, str) else service.tokenizer.decode(ids)) if req.echo else ""
        echoes += [echo] * n
    rid, created = greqs[0].request_id, int(time.time())

    def chunk(i: int, delta: Delta, text: str, finish: str | None) -> dict:
        logprobs = None
        if lp is not None:
            prompt_part = delta.prompt_logprobs if req.echo else None
            offset = 0 if prompt_part is not None else delta_offsets[i]
            logprobs = _classic_logprobs(service, greqs[i].prompt_token_ids if prompt_part is not None else None,
                                         prompt_part, delta.logprobs, offset)
            delta_offsets[i] = offset + len(text)
        return {"id": rid, "object": "text_completion", "created": created, "model": ctx.served_model_name,
                "choices": [{"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}]}

    delta_offsets = [0] * len(greqs)
    if req.stream:
        def stream_chunk(i: int, delta: Delta, first: bool) -> dict:
            text = (echoes[i] if first else "") + delta.text
            return chunk(i, delta, text, None)
        return await _stream(request, service, greqs, req, stream_chunk, lambda i, f: chunk(i, Delta("", 0, 0), "", f),
                             first=None, prompts=len(prompts))
    results = await _complete_all(service, greqs)
    choices = []
    for i, result in enumerate(results):
        delta = Delta(result.text, 0, 0, result.finish_reason, result.logprobs, result.prompt_logprobs)
        choices += chunk(i, delta, echoes[i] + result.text, result.finish_reason)["choices"]
    out = {"id": rid, "object": "text_completion", "created": created, "model": ctx.served_model_name,
           "choices": choices, "usage": _usage_of(results, n)}
    return web.json_response(out)


@inference_route("chat")
async def chat_completions(request: web.Request, ctx: ServerContext) -> web.StreamResponse:
    body = await _read_json(request)
    req: ChatCompletionRequest = _validate(ChatCompletionRequest, body)
    service = ctx.require_generation(req.model)
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
    ids = service.encode_chat(messages)
    lp = (req.top_logprobs or 0) if req.logprobs else None
    greq = _build(service, req, ids, chat=True, max_tokens=req.token_limit(), prefix="chatcmpl", logprobs=lp)
    n = req.choices_per_prompt()
    greqs = service.copies(greq, n, "chatcmpl")
    created = int(time.time())

    def logprobs(delta: Delta) -> dict | None:
        return None if lp is None else {"content": [_chat_logprob(service, t) for t in delta.logprobs]}

    def chunk(i: int, text: str | None, finish: str | None, role: bool = False,
              delta: Delta | None = None) -> dict:
        out: dict[str, str] = {"role": "assistant"} if role else {}
        if text is not None:
            out["content"] = text
        return {"id": greq.request_id, "object": "chat.completion.chunk", "created": created,
                "model": ctx.served_model_name,
                "choices": [{"index": i, "delta": out, "logprobs": None if delta is None else logprobs(delta),
                             "finish_reason": finish}]}

    if req.stream:
        return await _stream(request, service, greqs, req,
                             lambda i, d, _first: chunk(i, d.text or None, None, delta=d),
                             lambda i, f: chunk(i, None, f), first=[chunk(i, "", None, role=True) for i in range(n)],
                             prompts=1)
    results = await _complete_all(service, greqs)
    choices = [{"index": i, "message": {"role": "assistant", "content": r.text},
                "logprobs": logprobs(Delta(r.text, 0, 0, None, r.logprobs)), "finish_reason": r.finish_reason}
               for i, r in enumerate(results)]
    return web.json_response({
        "id": greq.request_id, "object": "chat.completion", "created": created, "model": ctx.served_model_name,
        "choices": choices, "usage": _usage_of(results, n)})


def _build(service: GenerationService, req: Any, ids: list[int], *, chat: bool, max_tokens: int | None,
           prefix: str, logprobs: int | None = None, prompt_logprobs: int | None = None) -> GenerationRequest:
    return service.build(ids, max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                         top_k=req.top_k, seed=req.seed, stop=req.stop_strings(),
                         ignore_eos=bool(req.ignore_eos), chat=chat, id_prefix=prefix,
                         param="messages" if chat else "prompt", logprobs=logprobs,
                         prompt_logprobs=prompt_logprobs)


async def _complete_all(service: GenerationService, greqs: list[GenerationRequest]) -> list[Generation]:
    """Every choice at once (they batch in the engine); one failing (e.g. 429) cancels the others."""
    if len(greqs) == 1:
        return [await service.complete(greqs[0])]
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(service.complete(g)) for g in greqs]
    return [t.result() for t in tasks]


def _usage_of(results: list[Generation], n: int) -> dict[str, int]:
    # A prompt counts once however many choices it has; every choice's tokens count.
    return _usage(sum(r.num_prompt_tokens for r in results[::n]), sum(r.num_output_tokens for r in results))


def _token_text(service: GenerationService, token_id: int) -> str:
    return service.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


def _classic_logprobs(service: GenerationService, prompt_ids: list[int] | None,
                      prompt_lp: list[TokenLogprob] | None, output_lp: list[TokenLogprob], offset: int) -> dict:
    """OpenAI's legacy completions format; with echo the prompt's tokens come first (the first has null)."""
    entries: list[tuple[int, TokenLogprob | None]] = []
    if prompt_ids is not None and prompt_lp is not None:
        entries.append((prompt_ids[0], None))
        entries += [(t.token_id, t) for t in prompt_lp]
    entries += [(t.token_id, t) for t in output_lp]
    tokens, token_lp, top, offsets = [], [], [], []
    for token_id, t in entries:
        text = _token_text(service, token_id)
        offsets.append(offset)
        offset += len(text)
        tokens.append(text)
        token_lp.append(None if t is None else t.logprob)
        top.append(None if t is None else {_token_text(service, i): v for i, v in t.top} or
                   {text: t.logprob})
    return {"tokens": tokens, "token_logprobs": token_lp, "top_logprobs": top, "text_offset": offsets}


def _chat_logprob(service: GenerationService, t: TokenLogprob) -> dict:
    def entry(token_id: int, logprob: float) -> dict:
        raw = service.tokenizer.token_bytes(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}

    return {**entry(t.token_id, t.logprob), "top_logprobs": [entry(i, v) for i, v in t.top]}


async def _merged(streams: list[AsyncIterator[Delta]]) -> AsyncIterator[tuple[int, Delta]]:
    """Deltas of several choices as they come, each with its choice index; a failure in one ends all."""
    if len(streams) == 1:
        async for delta in streams[0]:
            yield 0, delta
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: AsyncIterator[Delta]) -> None:
        try:
            async with aclosing(stream) as deltas:
                async for delta in deltas:
                    await queue.put((i, delta))
            await queue.put((i, done))
        except Exception as exc:    # delivered to the reader, which raises it
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:      # cancelling a pump aborts its engine request (the stream's finally)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _stream(request: web.Request, service: GenerationService, greqs: list[GenerationRequest], req: Any,
                  chunk: Callable[[int, Delta, bool], dict], final: Callable[[int, str], dict],
                  first: list[dict] | None, prompts: int) -> web.StreamResponse:
    """SSE: `data: {chunk}` events, optionally a usage chunk, then `data: [DONE]`.

    The first delta is awaited before the headers go out, so admission (429) and engine rejections
    (400) are still plain HTTP errors.
    """
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    resp = web.StreamResponse(headers=SSE_HEADERS)
    n = len(greqs) // prompts
    echo = bool(getattr(req, "echo", False))

    async def send(payload: dict | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        try:
            await resp.write(f"data: {data}\n\n".encode())
        except (ConnectionResetError, ConnectionError) as exc:
            raise ClientGoneError() from exc

    def with_usage(payload: dict) -> dict:
        if include_usage:
            payload["usage"] = None
        return payload

    started = [False] * len(greqs)
    prompt_tokens = [0] * len(greqs)
    output_tokens = [0] * len(greqs)
    async with aclosing(_merged([service.stream(g) for g in greqs])) as deltas:
        iterator = aiter(deltas)
        item = await anext(iterator, None)
        await resp.prepare(request)
        for payload in first or []:
            await send(with_usage(payload))
        try:
            while item is not None:
                i, delta = item
                prompt_tokens[i], output_tokens[i] = delta.num_prompt_tokens, delta.num_output_tokens
                # With echo the first chunk carries the prompt even when the delta has no text.
                if delta.text or delta.logprobs or delta.finish_reason is None or (echo and not started[i]):
                    await send(with_usage(chunk(i, delta, not started[i])))
                started[i] = True
                if delta.finish_reason is not None:
                    await send(with_usage(final(i, delta.finish_reason)))
                item = await anext(iterator, None)
            if include_usage:
                head = {k: v for k, v in final(0, "stop").items() if k != "choices"}
                await send({**head, "choices": [],
                            "usage": _usage(sum(prompt_tokens[::n]), sum(output_tokens))})
        except (ClientGoneError, asyncio.CancelledError):
            raise
        except Exception as exc:    # headers are gone: report in-band, as OpenAI-compatible servers do
            log.exception("stream %s failed", greqs[0].request_id)
            err = APIError(500, f"Generation failed: {exc}", type="internal_error", code="internal_error")
            await send(err.body())
    await send("[DONE]")
    await resp.write_eof()
    return resp


# ---- embeddings ----

@inference_route("embeddings")
async def embeddings(request: web.Request, ctx: ServerContext) -> web.StreamResponse:
    body = await _read_json(request)
    req: EmbeddingRequest = _validate(EmbeddingRequest, body)
    service = ctx.require_embeddings(req.model)
    if req.dimensions is not None and req.dimensions != service.dimension:
        raise bad_request(f"The model '{service.name}' produces {service.dimension}-dimensional embeddings; "
                          f"dimensions={req.dimensions} is not supported.", param="dimensions")
    ids = service.tokenize(req.texts())
    result = await service.embed(ids)
    data = []
    for i, vec in enumerate(result.vectors):
        array = vec.numpy()   # float32 (EmbeddingModel.embed_ids)
        value: Any = base64.b64encode(array.astype("<f4", copy=False).tobytes()).decode() \
            if req.encoding_format == "base64" else array
        data.append({"object": "embedding", "index": i, "embedding": value})
    body = {"object": "list", "data": data, "model": service.name,
            "usage": {"prompt_tokens": result.num_tokens, "total_tokens": result.num_tokens}}
    # orjson writes the float32 arrays directly, each number in its shortest form that reads back as the
    # same float32: 8 us and 4.8 kB per 384-d vector, where json.dumps of tolist() takes 180 us and 8.6 kB
    # (17-digit float64 spellings of float32 values), the largest per-request cost after the forward pass.
    return web.Response(body=orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), content_type="application/json")
