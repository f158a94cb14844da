"""lm-eval as a client: its `local-completions` backend against a real preheat-server serving
smollm2-135m gives the same per-item loglikelihoods as lm-eval's own HF backend on the same weights.

Everything is local: the task and its data are committed (model-server/eval/lmeval/), the HF backend
reads the same GGUF file through transformers (as test_gguf.py's reference does), and lm-eval's
tokenizer for the API backend is that same transformers tokenizer saved to a temporary folder. The
server is in-process on the test's event loop; lm-eval (synchronous `requests`) runs in a thread.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is its own extra: make test-lmeval (pip install -e .[lmeval])")

REPO = Path(__file__).resolve().parents[2]
TASK_DIR = REPO / "model-server" / "eval" / "lmeval"
TASK = "preheat_facts"
ATOL = 1e-3


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # No hub: the json builder, the tokenizer and the weights all come from local files.
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed task with its data path made absolute (the YAML's is relative to the repo root)."""
    config = yaml.safe_load((TASK_DIR / f"{TASK}.yaml").read_text())
    data = REPO / config["dataset_kwargs"]["data_files"]["test"]
    assert data.is_file(), data
    config["dataset_kwargs"]["data_files"]["test"] = str(data)
    out = tmp_path_factory.mktemp("lmeval-task")
    (out / f"{TASK}.yaml").write_text(yaml.safe_dump(config))
    return out


def _evaluate(task_dir: Path, model: str, model_args: dict[str, Any]) -> dict[tuple[int, int], float]:
    """{(doc id, choice index): loglikelihood} from lm-eval's logged samples."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    results = simple_evaluate(model=model, model_args=model_args, tasks=[TASK], log_samples=True,
                              task_manager=TaskManager(include_path=str(task_dir)), batch_size=1,
                              random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    samples = results["samples"][TASK]
    return {(s["doc_id"], i): float(r[0][0]) for s in samples for i, r in enumerate(s["resps"])}


@pytest.fixture(scope="module")
def gguf() -> Path:
    from preheat_server.models.gguf_file import smollm2_path

    return smollm2_path()


@pytest.fixture(scope="module")
def hf_loglikelihoods(task_dir: Path, gguf: Path) -> dict[tuple[int, int], float]:
    pytest.importorskip("transformers")
    torch.set_num_threads(2)
    return _evaluate(task_dir, "hf", {"pretrained": str(gguf.parent), "gguf_file": gguf.name,
                                      "dtype": "float32", "device": "cpu"})


@pytest.fixture(scope="module")
def tokenizer_dir(gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HF backend's tokenizer (transformers reading the GGUF), saved where lm-eval can load it by path."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("smollm2-tokenizer")
    transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    return out


async def test_local_completions_loglikelihoods_match_the_hf_backend(
        start_http_server: Any, task_dir: Path, tokenizer_dir: Path,
        hf_loglikelihoods: dict[tuple[int, int], float]) -> None:
    from preheat_server.models import load_model

    model = load_model("smollm2-135m", device="cpu", precision="fp32")
    live = await start_http_server(generation_loader=lambda _cfg: model, kv_cache_blocks=64, max_num_seqs=2,
                                   completion_cache_size=0)
    served = (await live.get("/v1/models"))[1]["data"][0]["id"]
    args = {"base_url": f"{live.url}/v1/completions", "model": served, "tokenizer_backend": "huggingface",
            "tokenizer": str(tokenizer_dir), "num_concurrent": 1, "max_retries": 1}
    ours = await asyncio.to_thread(_evaluate, task_dir, "local-completions", args)

    assert set(ours) == set(hf_loglikelihoods)
    docs = [json.loads(line) for line in (TASK_DIR / f"{TASK}.jsonl").read_text().splitlines()]
    assert len(ours) == sum(len(d["choices"]) for d in docs)
    worst = max(abs(ours[k] - hf_loglikelihoods[k]) for k in ours)
    assert worst <= ATOL, {k: (ours[k], hf_loglikelihoods[k]) for k in ours
                           if abs(ours[k] - hf_loglikelihoods[k]) > ATOL}
    # The numbers are real loglikelihoods of multi-token continuations, not a constant.
    assert all(v < 0 for v in ours.values()) and len({round(v, 3) for v in ours.values()}) > len(ours) // 2
