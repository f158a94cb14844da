"""Request and response shapes of the OpenAI-compatible API, as pydantic models.

The same models validate requests (strict types: `"5"` is not a number) and generate the OpenAPI
description (`openapi.py`), so the published schema cannot drift from what the server accepts.
Unknown fields are ignored, as OpenAI-compatible servers do (clients send `user`, `metadata`, ...);
known fields whose feature the server lacks (n > 1, logprobs, penalties, tools) are rejected with 400
rather than silently ignored, because the answer would not be what the client asked for.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_STOP_SEQUENCES = 4
MAX_SEED = 2**63 - 1


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Request):
    include_usage: bool = Field(False, description="Send a final chunk with token usage before [DONE].")


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class _SamplingFields(_Request):
    """Fields shared by completions and chat completions."""

    model: str | None = Field(None, description="Served model name; omitted means the server's model.")
    temperature: float | None = Field(1.0, ge=0.0, le=2.0, description="0 means greedy (deterministic).")
    top_p: float | None = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, description="vLLM extension; -1, 0 or absent mean no top-k.")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="Makes sampling reproducible.")
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = Field(
        None, description="Up to 4 strings; generation stops before the first one and it is not returned.")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(1, description="Only 1 is supported.")
    presence_penalty: float | None = Field(0.0, ge=-2.0, le=2.0, description="Only 0 is supported.")
    frequency_penalty: float | None = Field(0.0, ge=-2.0, le=2.0, description="Only 0 is supported.")
    logit_bias: dict[str, float] | None = Field(None, description="Not supported; omit or send {}.")
    ignore_eos: bool | None = Field(False, description="vLLM extension: keep generating past end-of-sequence.")

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise ValueError("only n=1 is supported.")
        return v

    @field_validator("stop")
    @classmethod
    def _non_empty_stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty.")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalties(cls, v: float | None) -> float | None:
        if v:
            raise ValueError("penalties are not supported; send 0 or omit it.")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, v: dict | None) -> dict | None:
        if v:
            raise ValueError("logit_bias is not supported; omit it or send {}.")
        return v

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_SamplingFields):
    """POST /v1/completions."""

    prompt: str | TokenIds | Annotated[list[str | TokenIds], Field(min_length=1, max_length=1)] = Field(
        description="A string, an array of token ids, or an array holding exactly one of those.")
    max_tokens: int | None = Field(16, ge=1, description="Tokens to generate at most (OpenAI's default 16).")
    echo: bool | None = Field(False, description="Only false is supported.")
    logprobs: int | None = Field(None, description="Not supported; omit it.")
    best_of: int | None = Field(None, description="Only 1 is supported.")
    suffix: str | None = Field(None, description="Not supported; omit it.")

    @field_validator("prompt")
    @classmethod
    def _non_empty_prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and len(v) == 1 and not isinstance(v[0], int):
            v = v[0]
        if v == "":
            raise ValueError("prompt must not be empty.")
        return v

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo=true is not supported.")
        if self.logprobs is not None:
            raise ValueError("logprobs are not supported.")
        if self.best_of not in (None, 1):
            raise ValueError("only best_of=1 is supported.")
        if self.suffix:
            raise ValueError("suffix is not supported.")
        return self


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | Annotated[list[TextPart], Field(min_length=1)] = Field(
        description="Text, or an array of text parts (images are not supported).")
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = Field(None, ge=1, description="Absent: until end-of-sequence or the context ends.")
    max_completion_tokens: int | None = Field(None, ge=1, description="Newer spelling of max_tokens.")
    logprobs: bool | None = Field(False, description="Only false is supported.")
    top_logprobs: int | None = Field(None, description="Not supported; omit it.")
    tools: list[dict[str, Any]] | None = Field(None, description="Not supported; omit it.")
    response_format: dict[str, Any] | None = Field(None, description="Only {\"type\": \"text\"} is supported.")

    @model_validator(mode="after")
    def _unsupported(self) -> ChatCompletionRequest:
        if self.logprobs or self.top_logprobs is not None:
            raise ValueError("logprobs are not supported.")
        if self.tools:
            raise ValueError("tools are not supported.")
        if self.response_format not in (None, {"type": "text"}):
            raise ValueError("only response_format {\"type\": \"text\"} is supported.")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class EmbeddingRequest(_Request):
    """POST /v1/embeddings."""

    input: Annotated[str, Field(min_length=1)] | Annotated[
        list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=2048)] = Field(
        description="A non-empty string or an array of up to 2048 non-empty strings.")
    model: str | None = None
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = Field(None, ge=1, description="Must equal the model's dimension if given.")

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


# ---- responses (used for the OpenAPI description and response-conformance checks) ----

FinishReason = Literal["stop", "length", "abort"]


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class EmbeddingUsage(_Response):
    prompt_tokens: int
    total_tokens: int


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: None = None
    finish_reason: FinishReason | None


class Completion(_Response):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class AssistantMessage(_Response):
    role: Literal["assistant"]
    content: str


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: FinishReason | None


class ChatCompletion(_Response):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ChatDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Response):
    index: int
    delta: ChatDelta
    logprobs: None = None
    finish_reason: FinishReason | None


class ChatCompletionChunk(_Response):
    """One SSE `data:` event of a streamed chat completion."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class Embedding(_Response):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="Floats, or base64 of little-endian float32.")


class EmbeddingList(_Response):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class ModelCard(_Response):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int | None = None


class ModelList(_Response):
    object: Literal["list"]
    data: list[ModelCard]


class ErrorDetail(_Response):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(_Response):
    error: ErrorDetail


class Health(_Response):
    status: Literal["ok", "loading", "draining"]
    state: Literal["loading", "ready", "draining"]
