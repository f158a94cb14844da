"""The server as real clients see it: the `openai` SDK (completions, chat, streaming, embeddings, its error
types), echo + logprobs as lm-eval's loglikelihood requests send them, n > 1, several prompts per request,
/tokenize, /detokenize, /health and --api-key. In-process servers on 127.0.0.1 with the tiny model."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
import torch

PROMPT = "The warm pool keeps replicas loaded"


def client(live: Any, key: str = "unused") -> openai.AsyncOpenAI:
    # No retries: a 429 must surface as the SDK's RateLimitError, not be retried away.
    return openai.AsyncOpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=120)


async def test_sdk_completions_chat_streaming_and_embeddings(start_http_server: Any, http_embedding_model: Any) -> None:
    live = await start_http_server(embedding_model="all-MiniLM-L6-v2",
                                   embedding_loader=lambda _name, _precision: http_embedding_model)
    sdk = client(live)
    done = await sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0)
    assert done.choices[0].finish_reason in ("stop", "length") and done.usage.completion_tokens >= 1
    pieces = [c.choices[0].text async for c in await sdk.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, stream=True) if c.choices]
    assert "".join(pieces) == done.choices[0].text

    chat = await sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=5, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens >= 1
    stream = await sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=5, temperature=0, stream=True,
                                               stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == chat.usage.completion_tokens

    emb = await sdk.embeddings.create(model="all-MiniLM-L6-v2", input=["warm pool", "cold start"])
    assert [len(d.embedding) for d in emb.data] == [384, 384]
    await sdk.close()


async def test_echo_logprobs_are_the_models_log_probabilities(start_http_server: Any, http_tiny_model: Any) -> None:
    """lm-eval's loglikelihood request: token-id prompts in one batch, echo, logprobs=1, max_tokens=1."""
    live = await start_http_server(completion_cache_size=0)
    sdk = client(live)
    tok = http_tiny_model.tokenizer
    prompts = [tok.encode(PROMPT), tok.encode("Lead time is the measured cold start")]
    out = await sdk.completions.create(model="tiny", prompt=prompts, max_tokens=1, logprobs=1, echo=True,
                                       temperature=0)
    assert [c.index for c in out.choices] == [0, 1]
    for ids, choice in zip(prompts, out.choices, strict=True):
        lp = choice.logprobs
        assert len(lp.token_logprobs) == len(ids) + 1 and lp.token_logprobs[0] is None
        with torch.inference_mode():
            logits = http_tiny_model.model.forward_dense(torch.tensor([ids]))[0].float()
        want = torch.log_softmax(logits, dim=-1)
        expected = [want[i, ids[i + 1]].item() for i in range(len(ids) - 1)]
        assert lp.token_logprobs[1:len(ids)] == pytest.approx(expected, abs=1e-4)
        # The top alternative at each prompt position is the model's argmax there.
        for i in range(len(ids) - 1):
            (best, value), = lp.top_logprobs[i + 1].items()
            assert value == pytest.approx(want[i].max().item(), abs=1e-4)
            assert best == tok.token_bytes(int(want[i].argmax())).decode("utf-8", errors="replace")
        assert choice.text.startswith(tok.decode(ids))
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    await sdk.close()


async def test_n_choices_streamed_and_not(start_http_server: Any) -> None:
    live = await start_http_server(completion_cache_size=0)
    sdk = client(live)
    out = await sdk.completions.create(model="tiny", prompt=[PROMPT, "cold start"], n=3, max_tokens=4,
                                       temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == list(range(6))
    assert out.usage.completion_tokens == 6 * 4
    chat_stream = await sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                    n=2, max_tokens=3, temperature=1.0, stream=True,
                                                    extra_body={"ignore_eos": True})
    finished = {c.choices[0].index for c in [c async for c in chat_stream] if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}
    await sdk.close()


async def test_chat_logprobs_content_format(start_http_server: Any) -> None:
    live = await start_http_server(completion_cache_size=0)
    sdk = client(live)
    out = await sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, temperature=0, logprobs=True, top_logprobs=2,
                                            extra_body={"ignore_eos": True})
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 4
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.logprob <= 0
        # Greedy: the chosen token is the most likely one.
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-5)
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token
    await sdk.close()


async def test_tokenize_detokenize_and_health(start_http_server: Any, http_tiny_model: Any) -> None:
    live = await start_http_server()
    status, body, _ = await live.post("/tokenize", {"prompt": PROMPT})
    assert status == 200 and body["tokens"] == http_tiny_model.tokenizer.encode(PROMPT)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 1024
    status, back, _ = await live.post("/detokenize", {"tokens": body["tokens"]})
    assert status == 200 and back["prompt"] == PROMPT
    status, chat, _ = await live.post("/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and chat["count"] > 2
    status, err, _ = await live.post("/detokenize", {"tokens": [10**6]})
    assert status == 400 and "out of range" in err["error"]["message"]
    status, err, _ = await live.post("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]})
    assert status == 400 and "exactly one" in err["error"]["message"]
    status, health = await live.get("/health")
    assert status == 200 and health["state"] == "ready"


async def test_api_key_and_the_sdks_error_types(start_http_server: Any) -> None:
    live = await start_http_server(api_key="s3cret", max_num_seqs=1, max_queue=0, completion_cache_size=0)
    with pytest.raises(openai.AuthenticationError) as denied:
        await client(live, "wrong").completions.create(model="tiny", prompt="x", max_tokens=1)
    assert "different key" in str(denied.value)
    status, body, _ = await live.post("/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert status == 401 and "no Authorization header" in body["error"]["message"]
    assert (await live.get("/health"))[0] == 200 and (await live.get("/health/ready"))[0] == 200
    assert (await live.metrics())  # /metrics answers without a key

    sdk = client(live, "s3cret")
    with pytest.raises(openai.BadRequestError) as bad:
        await sdk.completions.create(model="tiny", prompt="x", max_tokens=1, temperature=3)
    assert "temperature" in str(bad.value)
    # One long request holds the only place (max_num_seqs 1, no queue): the next is a RateLimitError.
    long = asyncio.ensure_future(sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=900,
                                                        extra_body={"ignore_eos": True}))
    await live.metrics_when(lambda m: m[("vllm:num_requests_running", ())] == 1)
    with pytest.raises(openai.RateLimitError):
        await sdk.completions.create(model="tiny", prompt="x", max_tokens=1)
    long.cancel()
    await asyncio.gather(long, return_exceptions=True)
    await sdk.close()
