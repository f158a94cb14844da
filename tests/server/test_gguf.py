"""smollm2-135m from its GGUF file: the same numbers as transformers reading the same file, and sense.

transformers (`from_pretrained(dir, gguf_file=...)`, through the `gguf` package) is the independent
reference: it dequantizes the same Q4_1/Q8_0 blocks and un-permutes q/k itself. Both run fp32 on CPU,
so logits differ only by summation order: max |diff| <= 1e-3 on logits of magnitude ~10-30.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from preheat_server.engine import EngineConfig, LLMEngine
from preheat_server.models.gguf_file import smollm2_path
from preheat_server.sampling import SamplingParams

LOGIT_ATOL = 1e-3
TEXT = "The warm pool keeps loaded replicas ready, so a burst of traffic is served without a cold start."


@pytest.fixture(scope="module")
def smollm2() -> Any:
    from preheat_server.models import load_model

    torch.set_num_threads(2)
    return load_model("smollm2-135m", device="cpu", precision="fp32")


@pytest.fixture(scope="module")
def reference() -> Any:
    transformers = pytest.importorskip("transformers")
    path = smollm2_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tok


def test_logits_and_greedy_output_match_transformers(smollm2: Any, reference: Any) -> None:
    model, _ = reference
    ids = smollm2.tokenizer.encode(TEXT)
    with torch.inference_mode():
        ours = smollm2.model.forward_dense(torch.tensor([ids]))[0].float()
        theirs = model(torch.tensor([ids])).logits[0].float()
    assert ours.shape == theirs.shape == (len(ids), 49152)
    assert (ours - theirs).abs().max().item() <= LOGIT_ATOL
    # Greedy continuation through the paged engine (prefill + decode steps) against generate().
    engine = LLMEngine(smollm2, EngineConfig(num_kv_blocks=32, max_num_seqs=2))
    got = engine.generate([ids], SamplingParams(max_tokens=16, ignore_eos=True))[0]
    with torch.inference_mode():
        want = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, min_new_tokens=16)
    assert got == want[0, len(ids):].tolist()


def test_tokenizer_and_chat_template_agree_with_transformers(smollm2: Any, reference: Any) -> None:
    _, tok = reference
    # No digits here: llama.cpp's "smollm" pre-tokenizer (which ours follows) splits every digit, a
    # rule transformers' GGUF converter does not carry over.
    assert smollm2.tokenizer.encode(TEXT) == tok.encode(TEXT, add_special_tokens=False)
    messages = [{"role": "user", "content": "Hi there"}]
    assert smollm2.tokenizer.apply_chat_template(messages) == tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)


def test_digits_are_split_one_by_one(smollm2: Any) -> None:
    tok = smollm2.tokenizer
    ids = tok.encode("year 2024")
    assert [tok.decode([i]) for i in ids[-4:]] == ["2", "0", "2", "4"]
    assert tok.decode(ids) == "year 2024"


def test_chat_answers_a_simple_factual_question(smollm2: Any) -> None:
    tok = smollm2.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
    engine = LLMEngine(smollm2, EngineConfig(num_kv_blocks=32, max_num_seqs=2))
    out = engine.generate([prompt], SamplingParams(max_tokens=24, stop_token_ids=tuple(tok.stop_token_ids)))[0]
    assert "Paris" in tok.decode(out)


async def test_chat_completion_over_http_applies_the_models_template(start_http_server: Any, smollm2: Any) -> None:
    live = await start_http_server(generation_loader=lambda _cfg: smollm2, kv_cache_blocks=64, max_num_seqs=2,
                                   completion_cache_size=0)
    question = {"role": "user", "content": "What is the capital of France?"}
    status, body, _ = await live.post("/v1/chat/completions", {"messages": [question], "max_tokens": 24,
                                                               "temperature": 0})
    assert status == 200, body
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "stop"    # ended at <|im_end|>, not the token limit
    # The prompt the server ran is the template's (system turn included), as /tokenize shows.
    status, tokens, _ = await live.post("/tokenize", {"messages": [question]})
    assert tokens["tokens"] == smollm2.tokenizer.encode(smollm2.tokenizer.apply_chat_template([question]))
    assert body["usage"]["prompt_tokens"] == tokens["count"]
