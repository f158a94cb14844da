"""The OpenAI-compatible API of a real server (tiny model, real engine) over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from preheat_server.http.schemas import ChatCompletion, ChatCompletionChunk, Completion, ErrorBody

PROMPT = "The warm pool keeps a replica ready so the lead time"


def _text_of_completion_events(events: list[str]) -> tuple[str, str | None, list[dict]]:
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    return text, (finish[-1] if finish else None), chunks


async def test_completion_json_and_usage(start_http_server: Any, http_tiny_model: Any) -> None:
    live = await start_http_server()
    status, body, _ = await live.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "temperature": 0,
                                                          "ignore_eos": True})
    assert status == 200, body
    Completion.model_validate(body)
    n_prompt = len(http_tiny_model.tokenizer.encode(PROMPT))
    assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 5, "total_tokens": n_prompt + 5}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["model"] == "tiny"


async def test_streaming_framing_ends_with_done_and_matches_unstreamed(start_http_server: Any) -> None:
    live = await start_http_server(completion_cache_size=0)
    request = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    _, whole, _ = await live.post("/v1/completions", request)
    events, headers = await live.stream("/v1/completions", request)
    assert headers["Content-Type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    text, finish, chunks = _text_of_completion_events(events)
    for c in chunks:
        Completion.model_validate(c)
        assert c["id"] == chunks[0]["id"]
    assert text == whole["choices"][0]["text"]
    assert finish == whole["choices"][0]["finish_reason"]


async def test_chat_stream_role_first_usage_last(start_http_server: Any) -> None:
    live = await start_http_server(completion_cache_size=0)
    request = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
               "max_tokens": 6, "temperature": 0, "stream_options": {"include_usage": True}}
    events, _ = await live.stream("/v1/chat/completions", request)
    assert events[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(e) for e in events[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    status, whole, _ = await live.post("/v1/chat/completions", {**request, "stream_options": None})
    assert status == 200
    ChatCompletion.model_validate(whole)
    assert whole["choices"][0]["message"]["content"] == streamed
    assert whole["usage"] == usage_chunk.usage.model_dump()


async def test_multibyte_characters_streamed_whole(start_http_server: Any, scripted_model: Any) -> None:
    """The scripted model emits 😀 (4 byte tokens) then é (2 byte tokens): each arrives whole."""
    loaded, trigger, expected = scripted_model
    live = await start_http_server(generation_loader=lambda _cfg: loaded, completion_cache_size=0)
    events, _ = await live.stream("/v1/completions", {"prompt": [trigger], "max_tokens": 10, "temperature": 0})
    assert events[-1] == "[DONE]"
    text, finish, chunks = _text_of_completion_events(events)
    pieces = [c["choices"][0]["text"] for c in chunks if c["choices"][0]["text"]]
    assert text == expected and finish == "stop"
    assert all("\ufffd" not in p for p in pieces), pieces
    assert "😀" in pieces[0] and any("é" in p for p in pieces)
    # Non-streamed gives the same text, and usage counts every byte token plus end-of-sequence.
    status, body, _ = await live.post("/v1/completions", {"prompt": [trigger], "max_tokens": 10, "temperature": 0})
    assert status == 200 and body["choices"][0]["text"] == expected
    assert body["usage"]["completion_tokens"] == 7


async def test_queue_full_429_and_disconnect_aborts(start_http_server: Any) -> None:
    """max_num_seqs 1 + max_queue 1: a third request is refused; dropping the clients frees the engine."""
    live = await start_http_server(max_num_seqs=1, max_queue=1, completion_cache_size=0)
    long = {"prompt": PROMPT, "max_tokens": 900, "ignore_eos": True, "stream": True}
    first = await live.session.post(live.url + "/v1/completions", json=long)
    assert first.status == 200
    await first.content.readuntil(b"\n\n")                # running
    second = asyncio.ensure_future(live.session.post(live.url + "/v1/completions", json=long))
    for _ in range(2000):                                  # until the second one is admitted and queued
        m = await live.metrics()
        if m[("vllm:num_requests_waiting", ())] == 1:
            break
        await asyncio.sleep(0.01)
    assert m[("vllm:num_requests_running", ())] == 1 and m[("vllm:num_requests_waiting", ())] == 1
    assert m[("preheat:max_num_seqs", ())] == 1 and m[("preheat:max_queue", ())] == 1

    status, body, headers = await live.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
    assert status == 429, body
    ErrorBody.model_validate(body)
    assert body["error"]["type"] == "rate_limit_error" and "at capacity" in body["error"]["message"]
    assert int(headers["Retry-After"]) >= 1

    first.close()                                          # client disconnects mid-stream
    second.cancel()
    aborts = ("vllm:request_success_total", (("finished_reason", "abort"),))
    m = await live.metrics_when(lambda m: m[aborts] == 2 and m[("vllm:num_requests_running", ())] == 0
                                and m[("vllm:num_requests_waiting", ())] == 0)
    assert m[("vllm:num_requests_running", ())] == 0 and m[("vllm:num_requests_waiting", ())] == 0
    assert m[("vllm:request_success_total", (("finished_reason", "abort"),))] == 2
    assert m[("preheat:requests_total", (("api", "completions"), ("outcome", "queue_full")))] == 1
    assert m[("vllm:kv_cache_usage_perc", ())] == 0.0
    # Capacity is back.
    status, body, _ = await live.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
    assert status == 200, body


BAD_COMPLETIONS: list[tuple[str, Any, str | None, str]] = [
    # (case, body or raw bytes, expected param, text expected in the message)
    ("malformed json", b'{"prompt": "x",', None, "not valid JSON"),
    ("not an object", b'["prompt"]', None, "JSON object"),
    ("empty body", b"", None, "empty"),
    ("missing prompt", {"max_tokens": 3}, "prompt", "Missing required parameter"),
    ("prompt wrong type", {"prompt": 42}, "prompt", "Invalid type"),
    ("max_tokens as string", {"prompt": "hi", "max_tokens": "5"}, "max_tokens", "valid integer"),
    ("max_tokens zero", {"prompt": "hi", "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ("temperature too high", {"prompt": "hi", "temperature": 2.5}, "temperature", "less than or equal to 2"),
    ("top_p zero", {"prompt": "hi", "top_p": 0}, "top_p", "greater than 0"),
    ("stream not a bool", {"prompt": "hi", "stream": "yes"}, "stream", "valid boolean"),
    ("n over 16", {"prompt": "hi", "n": 17}, "n", "less than or equal to 16"),
    ("best_of other than n", {"prompt": "hi", "n": 2, "best_of": 3}, None, "best_of must equal n"),
    ("too many stops", {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ("empty stop", {"prompt": "hi", "stop": [""]}, "stop", "must not be empty"),
    ("negative seed", {"prompt": "hi", "seed": -1}, "seed", "greater than or equal to 0"),
    ("logprobs over 20", {"prompt": "hi", "logprobs": 21}, "logprobs", "less than or equal to 20"),
    ("penalty", {"prompt": "hi", "presence_penalty": 0.5}, "presence_penalty", "not supported"),
    ("an empty prompt among several", {"prompt": ["a", ""]}, "prompt", "must not be empty"),
    ("token id out of vocab", {"prompt": [5, 99999]}, "prompt", "out of range"),
    ("negative token id", {"prompt": [5, -1]}, "prompt[1]", "greater than or equal to 0"),
    ("prompt longer than context", {"prompt": "warm pool " * 1500, "max_tokens": 1}, "prompt",
     "maximum context length"),
    ("prompt + max_tokens over context", {"prompt": PROMPT, "max_tokens": 1020}, "max_tokens",
     "maximum context length"),
]

BAD_CHAT: list[tuple[str, Any, str | None, str]] = [
    ("no messages", {"messages": []}, "messages", "at least 1"),
    ("unknown role", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "Input should be"),
    ("content wrong type", {"messages": [{"role": "user", "content": 7}]}, "messages[0].content", "Invalid type"),
    ("image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
     "messages[0].content[0].type", "should be 'text'"),
    ("tools", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, None,
     "tools are not supported"),
    ("top_logprobs without logprobs", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, None,
     "needs logprobs=true"),
    ("max_completion_tokens over context", {"messages": [{"role": "user", "content": "x"}],
                                            "max_completion_tokens": 5000}, "max_tokens", "maximum context"),
]

BAD_EMBEDDINGS: list[tuple[str, Any, str | None, str]] = [
    ("empty input list", {"input": []}, "input", "Invalid"),
    ("empty string", {"input": ""}, "input", "Invalid"),
    ("number input", {"input": 3}, "input", "Invalid type"),
    ("bad encoding", {"input": "x", "encoding_format": "hex"}, "encoding_format", "Input should be"),
    ("wrong dimensions", {"input": "x", "dimensions": 17}, "dimensions", "384-dimensional"),
    ("too long", {"input": "autoscaling " * 400}, "input", "at most 256"),
]


async def test_bad_input_answers_400_with_a_clear_error(start_http_server: Any, http_embedding_model: Any) -> None:
    live = await start_http_server(embedding_model="all-MiniLM-L6-v2",
                                   embedding_loader=lambda _name, _precision: http_embedding_model)
    failures = []
    for path, table in (("/v1/completions", BAD_COMPLETIONS), ("/v1/chat/completions", BAD_CHAT),
                        ("/v1/embeddings", BAD_EMBEDDINGS)):
        for case, body, param, needle in table:
            raw = body if isinstance(body, bytes) else None
            status, payload, _ = await live.post(path, None if raw is not None else body, raw=raw)
            try:
                assert status == 400
                ErrorBody.model_validate(payload)
                err = payload["error"]
                assert err["type"] == "invalid_request_error"
                assert needle.lower() in err["message"].lower()
                if param is not None:
                    assert err["param"] == param
            except (AssertionError, ValueError) as exc:
                failures.append(f"{path} {case}: {status} {payload} ({exc})")
    assert not failures, "\n".join(failures)
    m = await live.metrics()
    assert m[("preheat:requests_total", (("api", "completions"), ("outcome", "invalid")))] == len(BAD_COMPLETIONS)
    assert m[("vllm:prompt_tokens_total", ())] == 0     # nothing reached the engine


async def test_unknown_route_404_wrong_method_405_unknown_model_404(start_http_server: Any) -> None:
    live = await start_http_server()
    status, body = await live.get("/v1/nothing")
    assert status == 404 and body["error"]["code"] == "route_not_found"
    async with live.session.get(live.url + "/v1/completions") as r:
        body = await r.json()
        assert r.status == 405 and "POST" in r.headers["Allow"] and "POST" in body["error"]["message"]
    async with live.session.delete(live.url + "/health/ready") as r:
        assert r.status == 405 and (await r.json())["error"]["code"] == "method_not_allowed"
    status, body, _ = await live.post("/v1/completions", {"prompt": "x", "model": "gpt-17"})
    assert status == 404 and body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"
    status, body, _ = await live.post("/v1/embeddings", {"input": "x"})
    assert status == 400 and "--embedding-model" in body["error"]["message"]


async def test_unknown_fields_are_ignored(start_http_server: Any) -> None:
    live = await start_http_server()
    status, body, _ = await live.post("/v1/completions", {"prompt": "x", "max_tokens": 2, "user": "u-1",
                                                          "metadata": {"team": "a"}})
    assert status == 200, body


async def test_stop_string_cuts_before_the_stop(start_http_server: Any) -> None:
    live = await start_http_server(completion_cache_size=0)
    base = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    _, whole, _ = await live.post("/v1/completions", base)
    text = whole["choices"][0]["text"]
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop.strip(), f"greedy text too uniform to pick a stop string: {text!r}"
    expected = text[: text.index(stop)]
    _, cut, _ = await live.post("/v1/completions", {**base, "stop": [stop, "never-appears"]})
    assert cut["choices"][0]["text"] == expected
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] < whole["usage"]["completion_tokens"]
    events, _ = await live.stream("/v1/completions", {**base, "stop": stop})
    streamed, finish, _ = _text_of_completion_events(events)
    assert streamed == expected and finish == "stop" and stop not in streamed
    stops = ("vllm:request_success_total", (("finished_reason", "stop"),))
    m = await live.metrics_when(lambda m: m[stops] == 2 and m[("vllm:num_requests_running", ())] == 0)
    assert m[stops] == 2
    assert m[("vllm:num_requests_running", ())] == 0


async def test_completion_cache_answers_repeated_greedy_requests(start_http_server: Any) -> None:
    live = await start_http_server(completion_cache_size=4)
    request = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    _, a, _ = await live.post("/v1/completions", request)
    _, b, _ = await live.post("/v1/completions", request)
    assert a["choices"] == b["choices"] and a["usage"] == b["usage"] and a["id"] != b["id"]
    await live.post("/v1/completions", {**request, "temperature": 0.8, "seed": 1})   # sampled: never cached
    await live.post("/v1/completions", {**request, "temperature": 0.8, "seed": 1})
    await live.stream("/v1/completions", request)                                   # streamed: not cached
    m = await live.metrics()
    assert m[("preheat:completion_cache_hits_total", ())] == 1
    assert m[("vllm:prompt_tokens_total", ())] == 4 * a["usage"]["prompt_tokens"]   # the hit skipped the engine
    assert len(live.server.ctx.generation.cache) == 1


async def test_seeded_sampling_is_reproducible(start_http_server: Any) -> None:
    live = await start_http_server(completion_cache_size=0)
    request = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "top_p": 0.9, "seed": 7,
               "ignore_eos": True}
    _, a, _ = await live.post("/v1/completions", request)
    _, b, _ = await live.post("/v1/completions", request)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


async def test_metrics_add_up(start_http_server: Any, http_tiny_model: Any) -> None:
    """prompt tokens total = sum of prompt lengths; generation tokens = sum of completions; gauges idle at 0."""
    live = await start_http_server(max_num_seqs=4, max_queue=16, completion_cache_size=0)
    prompts = [f"{PROMPT} {i} " + "replica " * (i * 3) for i in range(10)]

    async def one(i: int, p: str) -> dict:
        body = {"prompt": p, "max_tokens": 3 + i % 4, "temperature": 0}
        if i % 3 == 0:
            events, _ = await live.stream("/v1/completions", {**body, "stream_options": {"include_usage": True}})
            return json.loads(events[-2])["usage"]
        _, out, _ = await live.post("/v1/completions", body)
        return out["usage"]

    usages = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    assert [u["prompt_tokens"] for u in usages] == [len(http_tiny_model.tokenizer.encode(p)) for p in prompts]
    m = await live.metrics()
    assert m[("vllm:prompt_tokens_total", ())] == sum(u["prompt_tokens"] for u in usages)
    assert m[("vllm:generation_tokens_total", ())] == sum(u["completion_tokens"] for u in usages)
    assert m[("vllm:num_requests_running", ())] == 0 and m[("vllm:num_requests_waiting", ())] == 0
    assert m[("preheat:requests_received_total", (("api", "completions"),))] == len(prompts)
    assert m[("preheat:requests_total", (("api", "completions"), ("outcome", "success")))] == len(prompts)
    finished = sum(m[("vllm:request_success_total", (("finished_reason", r),))] for r in ("stop", "length"))
    assert finished == len(prompts)
    assert m[("vllm:time_to_first_token_seconds_count", ())] == len(prompts)
    assert m[("vllm:e2e_request_latency_seconds_count", ())] == len(prompts)
    assert m[("vllm:inter_token_latency_seconds_count", ())] == sum(u["completion_tokens"] - 1 for u in usages)
    assert m[("preheat:batch_size_count", ())] >= 1
    assert m[("preheat:server_state", (("state", "ready"),))] == 1
    assert m[("preheat:model_load_seconds", ())] > 0
    # The kernels the loader chose on this CPU are exported as one info series.
    report = http_tiny_model.kernels
    kernel_labels = (("bf16_compute", report.bf16_compute), ("cpu_model", report.cpu_model), ("device", "cpu"),
                     ("kernel", report.main_kernel), ("precision", "fp32"))
    assert m[("preheat:kernels_info", kernel_labels)] == 1
    queries = m[("vllm:prefix_cache_queries_total", ())]
    assert 0 < m[("vllm:prefix_cache_hits_total", ())] <= queries   # the prompts share a prefix


async def test_readiness_503_while_loading_liveness_200(start_http_server: Any, http_tiny_model: Any) -> None:
    import threading

    gate = threading.Event()

    def slow_loader(_cfg: Any) -> Any:
        gate.wait(120)
        return http_tiny_model

    live = await start_http_server(generation_loader=slow_loader, wait=False)
    try:
        assert (await live.get("/health/live"))[0] == 200
        status, body = await live.get("/health/ready")
        assert status == 503 and body["state"] == "loading"
        status, err, headers = await live.post("/v1/completions", {"prompt": "x"})
        assert status == 503 and err["error"]["code"] == "model_loading" and "Retry-After" in headers
        m = await live.metrics()
        assert m[("preheat:server_state", (("state", "loading"),))] == 1
    finally:
        gate.set()
    await live.server.wait_ready()
    assert (await live.get("/health/ready"))[0] == 200
    assert (await live.get("/v2/health/ready"))[0] == 200


async def test_models_and_openapi_routes(start_http_server: Any) -> None:
    live = await start_http_server(served_model_name="acme-chat")
    status, body = await live.get("/v1/models")
    assert status == 200 and [c["id"] for c in body["data"]] == ["acme-chat"]
    assert body["data"][0]["max_model_len"] == 1024
    status, body, _ = await live.post("/v1/completions", {"prompt": "x", "model": "acme-chat", "max_tokens": 1})
    assert status == 200 and body["model"] == "acme-chat"
    status, spec = await live.get("/openapi.json")
    assert status == 200 and spec["openapi"].startswith("3.")
    assert {"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models", "/health/live",
            "/health/ready", "/metrics"} <= set(spec["paths"])


def test_committed_openapi_matches_the_request_models() -> None:
    from preheat_server.http.openapi import OPENAPI_PATH, render

    assert OPENAPI_PATH.read_text() == render(), \
        "openapi.json is stale: run `python -m preheat_server.http.openapi`"


async def test_oversized_body_413_json(start_http_server: Any) -> None:
    live = await start_http_server()
    async with live.session.post(live.url + "/v1/completions", data=b"x" * (17 * 1024 * 1024),
                                 headers={"Content-Type": "application/json"}) as r:
        assert r.status == 413
        assert (await r.json())["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_client_disconnect_before_first_token_aborts(start_http_server: Any, path: str) -> None:
    live = await start_http_server(completion_cache_size=0)
    body = {"prompt": PROMPT, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 900,
            "ignore_eos": True}
    task = asyncio.ensure_future(live.session.post(live.url + path, json=body))
    for _ in range(2000):
        if live.server.async_engine.num_in_flight == 1:
            break
        await asyncio.sleep(0.01)
    assert live.server.async_engine.num_in_flight == 1
    task.cancel()
    with pytest.raises((asyncio.CancelledError, aiohttp.ClientError)):
        await task
    aborts = ("vllm:request_success_total", (("finished_reason", "abort"),))
    m = await live.metrics_when(lambda m: m[aborts] == 1 and m[("vllm:num_requests_running", ())] == 0)
    assert live.server.async_engine.num_in_flight == 0
    assert m[("vllm:request_success_total", (("finished_reason", "abort"),))] == 1
