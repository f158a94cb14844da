"""The aiohttp application: routes, JSON errors for everything, health, metrics, models and OpenAPI.

Inference routes live in `inference.py`; this module wires them up and makes sure that whatever goes
wrong (unknown route, wrong method, oversized body, a bug) the client gets an OpenAI-style JSON error.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from importlib import resources

from aiohttp import web

from preheat_server.http import inference
from preheat_server.http.context import CONTEXT, ServerContext
from preheat_server.http.errors import APIError
from preheat_server.http.schemas import DetokenizeRequest, TokenizeRequest
from preheat_server.metrics import CONTENT_TYPE

log = logging.getLogger(__name__)

# 16 MiB: an embeddings batch of 2048 inputs fits; anything larger is a 413 with a JSON body.
MAX_BODY_BYTES = 16 * 1024 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as err:
        return err.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_exception_as_json(request, exc)
    except asyncio.CancelledError:
        raise
    except Exception:   # a bug: log it whole, tell the client without leaking internals
        log.exception("unhandled error on %s %s", request.method, request.path)
        return APIError(500, "Internal server error; the server logged the details.", type="internal_error",
                        code="internal_error").response()


# With --api-key these answer without a key: probes and Prometheus do not carry one.
OPEN_PATHS = frozenset({"/health", "/metrics", "/openapi.json"})
OPEN_PREFIXES = ("/health/", "/v2/health/")


def api_key_check(key: str) -> Callable:
    """Middleware: every route outside OPEN_PATHS needs `Authorization: Bearer <key>` (401 otherwise)."""
    expected = f"Bearer {key}".encode()

    @web.middleware
    async def require_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS and not request.path.startswith(OPEN_PREFIXES):
            got = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(got, expected):   # constant time: the key is not guessable by timing
                what = "has a different key" if got else "has no Authorization header"
                raise APIError(401, f"The request {what}; this server needs `Authorization: Bearer <api key>`.",
                               type="authentication_error", code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return require_key


def _http_exception_as_json(request: web.Request, exc: web.HTTPException) -> web.Response:
    headers = {}
    if exc.status == 404:
        message = f"No route {request.method} {request.path}. See /openapi.json for the API."
        kind, code = "not_found_error", "route_not_found"
    elif exc.status == 405:
        allowed = sorted(getattr(exc, "allowed_methods", ()) or ())
        message = f"Method {request.method} is not allowed on {request.path}; use {', '.join(allowed)}."
        kind, code = "invalid_request_error", "method_not_allowed"
        headers["Allow"] = ", ".join(allowed)
    elif exc.status == 413:
        message = f"The request body is larger than {MAX_BODY_BYTES} bytes."
        kind, code = "invalid_request_error", "request_too_large"
    else:
        message = exc.reason or "HTTP error"
        kind, code = "invalid_request_error", None
    return APIError(exc.status, message, type=kind, code=code, headers=headers).response()


async def health_live(request: web.Request) -> web.Response:
    """200 while the process runs: a failing liveness probe would restart a loading server."""
    state = request.app[CONTEXT].lifecycle.state
    return web.json_response({"status": "ok", "state": state})


async def health_ready(request: web.Request) -> web.Response:
    """200 only when serving; 503 while loading or draining, so no traffic is routed here then."""
    state = request.app[CONTEXT].lifecycle.state
    if state == "ready":
        return web.json_response({"status": "ok", "state": state})
    return web.json_response({"status": state, "state": state}, status=503)


async def tokenize(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    req: TokenizeRequest = inference._validate(TokenizeRequest, await inference._read_json(request))
    service = ctx.require_generation(req.model)
    if req.messages is not None:
        ids = service.encode_chat([{"role": m.role, "content": m.text()} for m in req.messages])
    else:
        ids = service.tokenizer.encode(req.prompt or "")
    return web.json_response({"count": len(ids), "max_model_len": service.max_model_len, "tokens": ids})


async def detokenize(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    req: DetokenizeRequest = inference._validate(DetokenizeRequest, await inference._read_json(request))
    service = ctx.require_generation(req.model)
    bad = next((t for t in req.tokens if t >= service.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"Token id {bad} is out of range: the vocabulary has {service.vocab_size} tokens.",
                       param="tokens", code="invalid_token_id")
    return web.json_response({"prompt": service.tokenizer.decode(req.tokens)})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[CONTEXT].metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def models(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]

    def card(name: str, max_len: int | None) -> dict:
        return {"id": name, "object": "model", "created": ctx.created, "owned_by": "preheat",
                "max_model_len": max_len}

    cards = []
    if ctx.generation is not None:
        cards.append(card(ctx.served_model_name, ctx.generation.max_model_len))
    if ctx.embeddings is not None:
        cards.append(card(ctx.embeddings.name, ctx.embeddings.model.max_seq_length))
    if not cards:   # still loading: the name is known, the limits are not yet
        cards.append(card(ctx.served_model_name, None))
    return web.json_response({"object": "list", "data": cards})


def openapi_text() -> str:
    return resources.files("preheat_server").joinpath("openapi.json").read_text()


async def openapi(request: web.Request) -> web.Response:
    return web.Response(text=openapi_text(), content_type="application/json")


def build_app(ctx: ServerContext) -> web.Application:
    middlewares = [json_errors]
    if ctx.config.api_key:
        middlewares.append(api_key_check(ctx.config.api_key))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[CONTEXT] = ctx
    app.router.add_post("/v1/completions", inference.completions)
    app.router.add_post("/v1/chat/completions", inference.chat_completions)
    app.router.add_post("/v1/embeddings", inference.embeddings)
    app.router.add_get("/v1/models", models, allow_head=False)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/health", health_ready, allow_head=False)   # vLLM's and guidellm's probe
    for prefix in ("", "/v2"):   # KServe v2 spells them /v2/health/...
        app.router.add_get(f"{prefix}/health/live", health_live, allow_head=False)
        app.router.add_get(f"{prefix}/health/ready", health_ready, allow_head=False)
    app.router.add_get("/metrics", metrics, allow_head=False)
    app.router.add_get("/openapi.json", openapi, allow_head=False)
    return app
