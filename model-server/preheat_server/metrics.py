"""Prometheus metrics of one model server: what the operator scales on and dashboards plot.

Names follow vLLM's where vLLM has one (so existing dashboards and autoscaler queries work) and
`preheat:` otherwise. Every series carries `model_name` as vLLM's do. Each server app owns its own
`CollectorRegistry` so that tests can run many apps in one process without name clashes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# vLLM's bucket boundaries, so quantiles compare across servers.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512)

SERVER_STATES = ("loading", "ready", "draining")
# Outcomes of a request at the HTTP layer (label values of preheat:requests_total).
OUTCOMES = ("success", "invalid", "queue_full", "unavailable", "cancelled", "error")
APIS = ("completions", "chat", "embeddings")

CONTENT_TYPE = CONTENT_TYPE_LATEST

if TYPE_CHECKING:  # the report's type only: metrics stay importable without torch
    from preheat_server.models.kernels import KernelReport


@dataclass
class ServerMetrics:
    """All metric objects of one server, already bound to its `model_name` where possible."""

    registry: CollectorRegistry
    model_name: str
    requests_received: Counter
    requests: Counter
    request_success: Counter
    num_requests_running: Gauge
    num_requests_waiting: Gauge
    time_to_first_token: Histogram
    inter_token_latency: Histogram
    e2e_request_latency: Histogram
    prompt_tokens: Counter
    generation_tokens: Counter
    kv_cache_usage: Gauge
    prefix_cache_hits: Counter
    prefix_cache_queries: Counter
    num_preemptions: Counter
    completion_cache_hits: Counter
    batch_size: Histogram
    model_load_seconds: Gauge
    model_download_seconds: Gauge
    server_state: Gauge
    max_num_seqs: Gauge
    max_queue: Gauge
    engine_step_failures: Counter
    embedding_inputs: Counter
    embedding_tokens: Counter
    embedding_batch_size: Histogram
    embedding_queue_delay: Histogram
    kernels_info: Gauge

    @classmethod
    def create(cls, model_name: str) -> ServerMetrics:
        reg = CollectorRegistry()
        m = ["model_name"]

        def counter(name: str, doc: str, labels: list[str] = m) -> Counter:
            return Counter(name, doc, labels, registry=reg)

        def gauge(name: str, doc: str, labels: list[str] = m) -> Gauge:
            return Gauge(name, doc, labels, registry=reg)

        def hist(name: str, doc: str, buckets: tuple, labels: list[str] = m) -> Histogram:
            return Histogram(name, doc, labels, registry=reg, buckets=buckets)

        metrics = cls(
            registry=reg,
            model_name=model_name,
            requests_received=counter(
                "preheat:requests_received_total",
                "Requests that arrived at an inference route (before validation); the request-rate signal.",
                [*m, "api"]),
            requests=counter("preheat:requests_total", "Finished HTTP inference requests by outcome.",
                             [*m, "api", "outcome"]),
            request_success=counter("vllm:request_success_total",
                                    "Generation requests the engine finished, by finish reason.",
                                    [*m, "finished_reason"]),
            num_requests_running=gauge("vllm:num_requests_running",
                                       "Sequences in the engine's running batch."),
            num_requests_waiting=gauge("vllm:num_requests_waiting",
                                       "Admitted generation requests waiting for a place in the batch."),
            time_to_first_token=hist("vllm:time_to_first_token_seconds",
                                     "Arrival to first generated token.", TTFT_BUCKETS),
            inter_token_latency=hist("vllm:inter_token_latency_seconds",
                                     "Time between consecutive generated tokens of one request.", ITL_BUCKETS),
            e2e_request_latency=hist("vllm:e2e_request_latency_seconds",
                                     "Arrival to last token of a generation request.", E2E_BUCKETS),
            prompt_tokens=counter("vllm:prompt_tokens_total", "Prompt tokens of requests given to the engine."),
            generation_tokens=counter("vllm:generation_tokens_total", "Tokens the engine generated."),
            kv_cache_usage=gauge("vllm:kv_cache_usage_perc",
                                 "Fraction of KV blocks in use (1 = full), as vLLM reports it."),
            prefix_cache_hits=counter("vllm:prefix_cache_hits_total",
                                      "Prompt tokens served from the prefix cache."),
            prefix_cache_queries=counter("vllm:prefix_cache_queries_total",
                                         "Prompt tokens looked up in the prefix cache."),
            num_preemptions=counter("vllm:num_preemptions_total",
                                    "Sequences preempted (recomputed later) because KV blocks ran out."),
            completion_cache_hits=counter("preheat:completion_cache_hits_total",
                                          "Deterministic requests answered from the completion cache."),
            batch_size=hist("preheat:batch_size", "Sequences in each engine step.", BATCH_BUCKETS),
            model_load_seconds=gauge("preheat:model_load_seconds",
                                     "The cold start: weight download (preheat-fetch, before the process) + "
                                     "process start to ready, including weight load and warm-up."),
            model_download_seconds=gauge("preheat:model_download_seconds",
                                         "The weight download part of the cold start (0 without a fetch, or "
                                         "from the node cache)."),
            server_state=gauge("preheat:server_state", "1 for the server's current state.", [*m, "state"]),
            max_num_seqs=gauge("preheat:max_num_seqs",
                               "Most sequences the engine runs at once (--max-num-seqs)."),
            max_queue=gauge("preheat:max_queue",
                            "Most admitted requests waiting beyond max_num_seqs before 429 (--max-queue)."),
            engine_step_failures=counter("preheat:engine_step_failures_total",
                                         "Engine steps that raised; their requests failed with 500."),
            embedding_inputs=counter("preheat:embedding_inputs_total", "Texts embedded."),
            embedding_tokens=counter("preheat:embedding_tokens_total", "Tokens of embedded texts."),
            embedding_batch_size=hist("preheat:embedding_batch_size",
                                      "Texts per embedding forward pass (dynamic batching).", BATCH_BUCKETS),
            embedding_queue_delay=hist("preheat:embedding_queue_delay_seconds",
                                       "Time an embedding input waited for its batch.", TTFT_BUCKETS),
            kernels_info=gauge("preheat:kernels_info",
                               "1 per loaded model: the kernel running most of its linears, chosen from the CPU's "
                               "features (bf16_compute: native, emulated or reference).",
                               [*m, "device", "precision", "kernel", "bf16_compute", "cpu_model"]),
        )
        metrics._prime()
        return metrics

    def _prime(self) -> None:
        """Create every labelled child at 0 so a fresh server exports the full set (rate() needs a 0)."""
        name = self.model_name
        for api in APIS:
            self.requests_received.labels(name, api)
            for outcome in OUTCOMES:
                self.requests.labels(name, api, outcome)
        for reason in ("stop", "length", "abort"):
            self.request_success.labels(name, reason)
        for state in SERVER_STATES:
            self.server_state.labels(name, state)
        for metric in (self.num_requests_running, self.num_requests_waiting, self.time_to_first_token,
                       self.inter_token_latency, self.e2e_request_latency, self.prompt_tokens,
                       self.generation_tokens, self.kv_cache_usage, self.prefix_cache_hits,
                       self.prefix_cache_queries, self.num_preemptions, self.completion_cache_hits,
                       self.batch_size, self.model_load_seconds, self.model_download_seconds, self.max_num_seqs, self.max_queue,
                       self.engine_step_failures):
            metric.labels(name)

    def prime_embeddings(self, embedding_model_name: str) -> None:
        """Embedding series carry the embedding model's name (it may differ from the server's)."""
        for metric in (self.embedding_inputs, self.embedding_tokens, self.embedding_batch_size,
                       self.embedding_queue_delay):
            metric.labels(embedding_model_name)

    def set_kernels(self, model_name: str, report: KernelReport) -> None:
        self.kernels_info.labels(model_name, report.device, report.precision, report.main_kernel,
                                 report.bf16_compute, report.cpu_model).set(1.0)

    def set_state(self, state: str) -> None:
        for s in SERVER_STATES:
            self.server_state.labels(self.model_name, s).set(1.0 if s == state else 0.0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
