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
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from preheat_server.generation.async_engine import EngineDeadError, EngineStepError, QueueFullError
from preheat_server.generation.service import Delta, GenerationRequest, GenerationService, InvalidRequestError
from preheat_server.http.context import CONTEXT, ServerContext
from preheat_server.http.errors import APIError, bad_request, from_validation_error
from preheat_server.http.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

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
    ids = service.encode_prompt(req.prompt)
    greq = _build(service, req, ids, chat=False, max_tokens=req.max_tokens, prefix="cmpl")
    created = int(time.time())

    def chunk(text: str, finish: str | None) -> dict:
        return {"id": greq.request_id, "object": "text_completion", "created": created,
                "model": ctx.served_model_name,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}

    if req.stream:
        return await _stream(request, service, greq, req, chunk, first=None)
    result = await service.complete(greq)
    out = chunk(result.text, result.finish_reason)
    out["usage"] = _usage(result.num_prompt_tokens, result.num_output_tokens)
    return web.json_response(out)


@inference_route("chat")
async def chat_completions(request: web.Request, ctx: ServerContext) -> web.StreamResponse:
    body = await _read_json(request)
    req: ChatCompletionRequest = _validate(ChatCompletionRequest, body)
    service = ctx.require_generation(req.model)
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
    ids = service.encode_chat(messages)
    greq = _build(service, req, ids, chat=True, max_tokens=req.token_limit(), prefix="chatcmpl")
    created = int(time.time())

    def chunk(text: str | None, finish: str | None, role: bool = False) -> dict:
        delta: dict[str, str] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        return {"id": greq.request_id, "object": "chat.completion.chunk", "created": created,
                "model": ctx.served_model_name,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    if req.stream:
        return await _stream(request, service, greq, req, lambda t, f: chunk(t or None, f),
                             first=chunk("", None, role=True))
    result = await service.complete(greq)
    return web.json_response({
        "id": greq.request_id, "object": "chat.completion", "created": created, "model": ctx.served_model_name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text}, "logprobs": None,
                     "finish_reason": result.finish_reason}],
        "usage": _usage(result.num_prompt_tokens, result.num_output_tokens)})


def _build(service: GenerationService, req: Any, ids: list[int], *, chat: bool, max_tokens: int | None,
           prefix: str) -> GenerationRequest:
    return service.build(ids, max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                         top_k=req.top_k, seed=req.seed, stop=req.stop_strings(),
                         ignore_eos=bool(req.ignore_eos), chat=chat, id_prefix=prefix,
                         param="messages" if chat else "prompt")


async def _stream(request: web.Request, service: GenerationService, greq: GenerationRequest, req: Any,
                  chunk: Callable[[str, str | None], dict], first: dict | None) -> web.StreamResponse:
    """SSE: `data: {chunk}` events, optionally a usage chunk, then `data: [DONE]`.

    The first delta is awaited before the headers go out, so admission (429) and engine rejections
    (400) are still plain HTTP errors.
    """
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    resp = web.StreamResponse(headers=SSE_HEADERS)

    async def send(payload: dict | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        try:
            await resp.write(f"data: {data}\n\n".encode())
        except (ConnectionResetError, ConnectionError) as exc:
            raise ClientGoneError() from exc

    def with_usage(payload: dict, usage: dict | None) -> dict:
        if include_usage:
            payload["usage"] = usage
        return payload

    async with aclosing(service.stream(greq)) as deltas:
        iterator = aiter(deltas)
        last: Delta | None = await anext(iterator, None)
        await resp.prepare(request)
        if first is not None:
            await send(with_usage(first, None))
        try:
            while last is not None:
                if last.text or last.finish_reason is None:
                    await send(with_usage(chunk(last.text, None), None))
                if last.finish_reason is not None:
                    await send(with_usage(chunk("", last.finish_reason), None))
                    if include_usage:
                        await send({**{k: v for k, v in chunk("", None).items() if k != "choices"},
                                    "choices": [],
                                    "usage": _usage(last.num_prompt_tokens, last.num_output_tokens)})
                    break
                last = await anext(iterator, None)
        except (ClientGoneError, asyncio.CancelledError):
            raise
        except Exception as exc:    # headers are gone: report in-band, as OpenAI-compatible servers do
            log.exception("stream %s failed", greq.request_id)
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
