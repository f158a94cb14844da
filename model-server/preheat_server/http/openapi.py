"""Builds the OpenAPI 3.1 description from the same pydantic models that validate requests.

`python -m preheat_server.http.openapi` rewrites `preheat_server/openapi.json`; a test fails when
the committed file differs from what this produces, so the published description stays accurate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic.json_schema import models_json_schema

from preheat_server.http import schemas as s

OPENAPI_PATH = Path(__file__).resolve().parent.parent / "openapi.json"

_MODELS = [
    (s.CompletionRequest, "validation"), (s.ChatCompletionRequest, "validation"),
    (s.EmbeddingRequest, "validation"), (s.Completion, "serialization"), (s.ChatCompletion, "serialization"),
    (s.ChatCompletionChunk, "serialization"), (s.EmbeddingList, "serialization"),
    (s.ModelList, "serialization"), (s.ErrorBody, "serialization"), (s.Health, "serialization"),
    (s.TokenizeRequest, "validation"), (s.DetokenizeRequest, "validation"),
    (s.TokenizeResponse, "serialization"), (s.DetokenizeResponse, "serialization"),
]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str, retry_after: bool = False) -> dict[str, Any]:
    out = _json(_ref("ErrorBody"), description)
    if retry_after:
        out["headers"] = {"Retry-After": {"description": "Seconds to wait before retrying.",
                                          "schema": {"type": "string"}}}
    return out


def _inference_errors() -> dict[str, Any]:
    return {
        "400": _error("Malformed JSON, a wrong type, an out-of-range or unsupported parameter, or a prompt "
                      "longer than the context."),
        "401": _error("--api-key is set and the request lacks `Authorization: Bearer <key>` or has another key."),
        "404": _error("The requested model is not served here."),
        "413": _error("The body is larger than 16 MiB."),
        "429": _error("The queue is full (max-num-seqs + max-queue requests in flight).", retry_after=True),
        "503": _error("The server is loading or draining.", retry_after=True),
    }


def build_openapi() -> dict[str, Any]:
    _, defs = models_json_schema(_MODELS, ref_template="#/components/schemas/{model}")
    components = defs["$defs"]
    # Each server-sent event: `data:` holds one JSON chunk (Completion / ChatCompletionChunk shape,
    # or an ErrorBody if generation fails mid-stream); the last event's data is `[DONE]`.
    sse = {"schema": {"type": "object", "required": ["data"],
                      "properties": {"data": {"type": "string",
                                              "description": "A JSON chunk, or [DONE] for the last event."},
                                     "event": {"type": "string"}, "id": {"type": "string"}}}}

    def post(op_id: str, summary: str, request: str, ok: dict[str, Any]) -> dict[str, Any]:
        return {"post": {
            "operationId": op_id, "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {"200": ok, **_inference_errors()}}}

    def get(op_id: str, summary: str, responses: dict[str, Any]) -> dict[str, Any]:
        return {"get": {"operationId": op_id, "summary": summary, "responses": responses}}

    paths = {
        "/v1/completions": post(
            "createCompletion", "Complete a prompt (OpenAI legacy completions).", "CompletionRequest",
            {"description": "The completion, or an SSE stream of Completion chunks when stream=true.",
             "content": {"application/json": {"schema": _ref("Completion")}, "text/event-stream": sse}}),
        "/v1/chat/completions": post(
            "createChatCompletion", "Answer a conversation (ChatML template).", "ChatCompletionRequest",
            {"description": "The answer, or an SSE stream of ChatCompletionChunk when stream=true.",
             "content": {"application/json": {"schema": _ref("ChatCompletion")}, "text/event-stream": sse}}),
        "/v1/embeddings": post(
            "createEmbedding", "Embed texts (unit-length vectors, dynamic batching).", "EmbeddingRequest",
            _json(_ref("EmbeddingList"), "One embedding per input, in input order.")),
        "/tokenize": post("tokenize", "Token ids of a prompt, or of chat messages after the chat template.",
                          "TokenizeRequest", _json(_ref("TokenizeResponse"), "The token ids.")),
        "/detokenize": post("detokenize", "The text of token ids.", "DetokenizeRequest",
                            _json(_ref("DetokenizeResponse"), "The text.")),
        "/v1/models": get("listModels", "The models this server serves.",
                          {"200": _json(_ref("ModelList"), "Served models.")}),
        "/health/live": get("liveness", "200 while the process runs (also while loading and draining).",
                            {"200": _json(_ref("Health"), "Alive.")}),
        "/health": get("health", "200 when serving; 503 while loading or draining (as /health/ready).",
                       {"200": _json(_ref("Health"), "Ready."),
                        "503": _json(_ref("Health"), "Loading or draining: send no traffic.")}),
        "/health/ready": get("readiness", "200 when serving; 503 while loading or draining.",
                             {"200": _json(_ref("Health"), "Ready."),
                              "503": _json(_ref("Health"), "Loading or draining: send no traffic.")}),
        "/metrics": get("metrics", "Prometheus text exposition (vllm:* and preheat:* series).",
                        {"200": {"description": "Metrics.",
                                 "content": {"text/plain": {"schema": {"type": "string"}}}}}),
        "/openapi.json": get("openapi", "This description.",
                             {"200": _json({"type": "object"}, "OpenAPI 3.1 document.")}),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Preheat model server", "version": "0.1.0",
                 "description": "OpenAI-compatible completions, chat completions and embeddings with "
                                "Prometheus metrics and honest health endpoints. Errors are "
                                "{\"error\": {message, type, param, code}}."},
        "paths": paths,
        "components": {"schemas": components},
    }


def render() -> str:
    return json.dumps(build_openapi(), indent=2, sort_keys=False) + "\n"


def main() -> int:
    OPENAPI_PATH.write_text(render())
    print(f"wrote {OPENAPI_PATH}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
