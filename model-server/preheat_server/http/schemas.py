"""Request and response shapes of the OpenAI-compatible API, as pydantic models.

The same models validate requests (strict types: `"5"` is not a number) and generate the OpenAPI
description (`openapi.py`), so the published schema cannot drift from what the server accepts.
Unknown fields are ignored, as OpenAI-compatible servers do (clients send `user`, `metadata`, ...);
known fields whose feature the server lacks (penalties, logit_bias, tools, suffix) are rejected with 400
rather than silently ignored, because the answer would not be what the client asked for.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_STOP_SEQUENCES = 4
MAX_SEED = 2**63 - 1
MAX_N = 16           # choices per prompt
MAX_PROMPTS = 256    # prompts per completions request (lm-eval sends its batches as one request)
MAX_LOGPROBS = 20


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
    n: int | None = Field(1, ge=1, le=MAX_N, description="Choices to generate for each prompt.")
    presence_penalty: float | None = Field(0.0, ge=-2.0, le=2.0, description="Only 0 is supported.")
    frequency_penalty: float | None = Field(0.0, ge=-2.0, le=2.0, description="Only 0 is supported.")
    logit_bias: dict[str, float] | None = Field(None, description="Not supported; omit or send {}.")
    ignore_eos: bool | None = Field(False, description="vLLM extension: keep generating past end-of-sequence.")

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

    def choices_per_prompt(self) -> int:
        return 1 if self.n is None else self.n

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_SamplingFields):
    """POST /v1/completions."""

    prompt: str | TokenIds | Annotated[list[str | TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)] = Field(
        description=f"A string, an array of token ids, or an array of up to {MAX_PROMPTS} of those "
                    "(each gets its own choices, in order).")
    max_tokens: int | None = Field(16, ge=1, description="Tokens to generate at most (OpenAI's default 16).")
    echo: bool | None = Field(False, description="Return the prompt before the completion (with its "
                                                 "log-probabilities when logprobs is set).")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description=(
        "Log-probability of each token and of this many most likely alternatives (classic format)."))
    best_of: int | None = Field(None, description="Only equal to n (or absent) is supported.")
    suffix: str | None = Field(None, description="Not supported; omit it.")

    @field_validator("prompt")
    @classmethod
    def _non_empty_prompt(cls, v: Any) -> Any:
        if v == "" or (isinstance(v, list) and any(p == "" for p in v)):
            raise ValueError("prompt must not be empty.")
        return v

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        if self.best_of not in (None, self.choices_per_prompt()):
            raise ValueError("best_of must equal n (or be omitted): choices are not ranked.")
        if self.suffix:
            raise ValueError("suffix is not supported.")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list: a string or a token-id array is one prompt."""
        if isinstance(self.prompt, str) or (self.prompt and isinstance(self.prompt[0], int)):
            return [self.prompt]  # type: ignore[list-item]
        return list(self.prompt)  # type: ignore[arg-type]


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
    logprobs: bool | None = Field(False, description="Return each output token's log-probability.")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS,
                                     description="With logprobs: this many most likely alternatives per token.")
    tools: list[dict[str, Any]] | None = Field(None, description="Not supported; omit it.")
    response_format: dict[str, Any] | None = Field(None, description="Only {\"type\": \"text\"} is supported.")

    @model_validator(mode="after")
    def _unsupported(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true.")
        if self.tools:
            raise ValueError("tools are not supported.")
        if self.response_format not in (None, {"type": "text"}):
            raise ValueError("only response_format {\"type\": \"text\"} is supported.")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(_Request):
    """POST /tokenize (vLLM's shape): a prompt, or chat messages rendered with the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send exactly one of prompt and messages.")
        return self


class DetokenizeRequest(_Request):
    """POST /detokenize."""

    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


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


class CompletionLogprobs(_Response):
    """The classic format: parallel arrays, one entry per token (the first prompt token's are null)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None


class Completion(_Response):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Response):
    content: list[ChatTokenLogprob] | None


class AssistantMessage(_Response):
    role: Literal["assistant"]
    content: str


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
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
    logprobs: ChatLogprobs | None = None
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


class TokenizeResponse(_Response):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(_Response):
    prompt: str


class Health(_Response):
    status: Literal["ok", "loading", "draining"]
    state: Literal["loading", "ready", "draining"]
