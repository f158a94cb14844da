"""The InferenceEndpoint spec as pydantic v2 models: the one source of the CRD schema and its checks.

Every cross-field rule lives twice on purpose: as a pydantic validator (the operator never acts on a
spec it cannot explain) and as a CEL rule in the CRD (the API server rejects it before it is stored).
`tests/operator/test_spec_crd.py` checks that both explain a bad spec in the same words, and
`tests/operator/test_operator_cluster.py` that a real API server rejects the bad samples.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from preheat.controller import warm_size
from preheat.controller.warm_size import MEMORY_COST_PER_GIB

GROUP = "preheat.dev"
VERSION = "v1alpha1"
KIND = "InferenceEndpoint"
PLURAL = "inferenceendpoints"
SINGULAR = "inferenceendpoint"
SHORT_NAMES = ["ie", "iep"]

BUILTIN_MODELS = ("tiny", "small", "all-MiniLM-L6-v2")
# Where the init container puts a model.uri download (an emptyDir; the server mounts it read-only).
FETCHED_MODEL_PATH = "/model-store/model"

# A quantity as Kubernetes writes it: "500m", "2Gi" or a bare integer.
Quantity = Annotated[str | int, Field(json_schema_extra={"x-kubernetes-int-or-string": True})]


def _full_default(model: type[BaseModel]) -> dict[str, Any]:
    """The fully defaulted object, as the CRD's default for an omitted sub-object.

    An empty `{}` default would not do: the API server checks CEL rules against the default before
    nested defaults apply, and `self.minReplicas` would not exist.
    """
    return model().model_dump(by_alias=True, mode="json", exclude_none=True)


def _sub(model: type[BaseModel]) -> Any:
    """A sub-object field that defaults to the fully defaulted model (in Python and in the CRD)."""
    return Field(default_factory=model, json_schema_extra=lambda schema: schema.update(default=_full_default(model)))


def _cel(rule: str, message: str) -> dict[str, str]:
    return {"rule": rule, "message": message}


class _Model(BaseModel):
    """camelCase on the wire (Kubernetes style), snake_case in Python; unknown fields are errors."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Precision(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    int8 = "int8"
    int4 = "int4"


class ModelSpec(_Model):
    """Which weights the serving replicas load: a built-in name, a path in the image or on a PVC, or a
    URI downloaded before the server starts (an init container running preheat-fetch, as KServe's
    storage initializer does), so the download is part of each replica's cold start."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "(has(self.builtin) ? 1 : 0) + (has(self.path) ? 1 : 0) + (has(self.uri) ? 1 : 0) == 1",
                    "model: set exactly one of model.builtin (tiny, small, all-MiniLM-L6-v2), model.path or model.uri",
                ),
                _cel(
                    "!has(self.persistentVolumeClaim) || has(self.path)",
                    "model.persistentVolumeClaim needs model.path (where the weights are on the volume)",
                ),
                _cel(
                    "!has(self.path) || self.path.startsWith('/')",
                    "model.path must be an absolute path",
                ),
                _cel(
                    "!has(self.uri) || self.uri.startsWith('http://') || self.uri.startsWith('https://')",
                    "model.uri must start with http:// or https:// (other schemes are not supported)",
                ),
                _cel("!has(self.sha256) || has(self.uri)", "model.sha256 needs model.uri (it checks the download)"),
                _cel(
                    "!has(self.sha256) || !has(self.uri) || !self.uri.endsWith('/')",
                    "model.sha256 checks an archive; a folder model.uri (ending in /) has none",
                ),
                _cel("!has(self.cacheOnNode) || !self.cacheOnNode || has(self.uri)",
                     "model.cacheOnNode needs model.uri (only downloaded weights are cached)"),
            ]
        }
    )

    builtin: str | None = Field(
        default=None,
        description="A model the server ships with.",
        json_schema_extra={"enum": list(BUILTIN_MODELS)},
    )
    path: str | None = Field(
        default=None,
        max_length=4096,
        description="Absolute path of a model directory: baked into the image, or on the PVC below.",
    )
    uri: str | None = Field(
        default=None,
        max_length=4096,
        description="http:// or https:// URI of the weights, downloaded into the pod before the server starts: "
        "a tar or tar.gz archive of a model folder, or a folder listing when it ends in /.",
    )
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Expected sha256 of the archive at model.uri (lowercase hex); a mismatch fails the pod.",
    )
    cache_on_node: bool = Field(
        default=False,
        description="Keep downloaded weights in a per-node cache (a hostPath, /var/cache/preheat/models, "
        "writable by uid 65532) so a second replica on the node does not download them again.",
    )
    persistent_volume_claim: str | None = Field(
        default=None,
        max_length=253,
        description="PVC holding the weights, mounted read-only at mountPath.",
    )
    mount_path: str = Field(default="/models", description="Where the PVC is mounted in the pod.")
    precision: Precision = Field(default=Precision.fp32, description="Weight precision the server loads.")
    served_model_name: str | None = Field(
        default=None, max_length=253, description="Name in the OpenAI API (default: the endpoint's name)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if sum(x is not None for x in (self.builtin, self.path, self.uri)) != 1:
            raise ValueError(
                "model: set exactly one of model.builtin (tiny, small, all-MiniLM-L6-v2), model.path or model.uri"
            )
        if self.builtin is not None and self.builtin not in BUILTIN_MODELS:
            raise ValueError(f"model.builtin must be one of {', '.join(BUILTIN_MODELS)}")
        if self.persistent_volume_claim is not None and self.path is None:
            raise ValueError("model.persistentVolumeClaim needs model.path (where the weights are on the volume)")
        if self.path is not None and not self.path.startswith("/"):
            raise ValueError("model.path must be an absolute path")
        if self.uri is not None and not self.uri.startswith(("http://", "https://")):
            raise ValueError("model.uri must start with http:// or https:// (other schemes are not supported)")
        if self.sha256 is not None and self.uri is None:
            raise ValueError("model.sha256 needs model.uri (it checks the download)")
        if self.sha256 is not None and self.uri is not None and self.uri.endswith("/"):
            raise ValueError("model.sha256 checks an archive; a folder model.uri (ending in /) has none")
        if self.cache_on_node and self.uri is None:
            raise ValueError("model.cacheOnNode needs model.uri (only downloaded weights are cached)")
        # The server refuses these at start-up; saying so here keeps a bad CR from crash-looping pods.
        if self.builtin == "all-MiniLM-L6-v2" and self.precision not in (Precision.fp32, Precision.bf16):
            raise ValueError(f"model.precision {self.precision.value} does not apply to the embedding model "
                             "all-MiniLM-L6-v2: use fp32 or bf16")
        return self

    @property
    def server_arg(self) -> str:
        """What the server's --model flag gets (a downloaded model: where the init container put it)."""
        if self.uri is not None:
            return FETCHED_MODEL_PATH
        return self.builtin if self.builtin is not None else str(self.path)


class AcceleratorType(StrEnum):
    cpu = "cpu"
    gpu = "gpu"


class Toleration(_Model):
    key: str | None = None
    operator: str | None = Field(default=None, json_schema_extra={"enum": ["Exists", "Equal"]})
    value: str | None = None
    effect: str | None = Field(
        default=None, json_schema_extra={"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]}
    )
    toleration_seconds: int | None = None


class AcceleratorSpec(_Model):
    """Where a serving replica runs: CPU, or N GPUs (nvidia.com/gpu) on nodes picked by selector."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.type != 'gpu' || self.count >= 1",
                    "accelerator.count must be at least 1 when accelerator.type is gpu",
                )
            ]
        }
    )

    type: AcceleratorType = Field(default=AcceleratorType.cpu, description="cpu or gpu.")
    count: int = Field(default=0, ge=0, le=16, description="GPUs per replica (gpu only).")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)

    @model_validator(mode="after")
    def _gpu_count(self) -> AcceleratorSpec:
        if self.type is AcceleratorType.gpu and self.count < 1:
            raise ValueError("accelerator.count must be at least 1 when accelerator.type is gpu")
        return self


class ResourcesSpec(_Model):
    """Container resources (Kubernetes quantities). GPUs come from accelerator.count, not from here."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)


# A Secret's name is a DNS subdomain; a key in it, letters, digits, '-', '_' and '.' (Kubernetes' own
# rules). `[.]`, not an escaped dot: the same pattern goes into CEL string literals unchanged.
SECRET_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"
API_KEY_ENV = "PREHEAT_API_KEY"  # what preheat-server reads when --api-key is not given


class SecretKeyRef(_Model):
    """One key of a Secret in the endpoint's namespace (a container env var's secretKeyRef)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(f"self.name.matches('{SECRET_NAME}')",
                     "server.apiKeySecret.name must be a Secret name: lowercase letters, digits, '-', '.'"),
                _cel(f"self.key.matches('{SECRET_KEY}')",
                     "server.apiKeySecret.key must be a Secret key: letters, digits, '-', '_', '.'"),
            ]
        }
    )

    name: str = Field(max_length=253, description="The Secret's name (in the endpoint's namespace).")
    key: str = Field(max_length=253, description="The key in the Secret whose value is the API key.")

    @model_validator(mode="after")
    def _names(self) -> SecretKeyRef:
        if not re.match(SECRET_NAME, self.name):
            raise ValueError(
                "server.apiKeySecret.name must be a Secret name: lowercase letters, digits, '-', '.'"
                f" (got {self.name!r})")
        if not re.match(SECRET_KEY, self.key):
            raise ValueError(
                "server.apiKeySecret.key must be a Secret key: letters, digits, '-', '_', '.'"
                f" (got {self.key!r})")
        return self


class ServerSpec(_Model):
    """Model-server knobs: each becomes the preheat-server flag of the same name.

    max_num_seqs and max_queue bound one replica's capacity by its own slots rather than by the
    node's CPU, which is what makes per-replica targets meaningful.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(f"!has(self.apiKeySecret) || !has(self.env) || !('{API_KEY_ENV}' in self.env)",
                     "server.env sets PREHEAT_API_KEY and server.apiKeySecret sets it too: keep one (the Secret)"),
            ]
        }
    )

    image: str | None = Field(default=None, description="Default: preheat/model-server:<operator version>.")
    port: int = Field(default=8000, ge=1, le=65535)
    max_num_seqs: int | None = Field(default=None, ge=1, le=4096)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    kv_cache_blocks: int | None = Field(default=None, ge=1)
    block_size: int | None = Field(default=None, ge=1, le=1024)
    max_queue: int | None = Field(default=None, ge=0)
    target_itl_ms: float | None = Field(default=None, gt=0)
    drain_timeout_seconds: int = Field(
        default=30, ge=0, le=3600, description="How long a stopping replica finishes in-flight requests."
    )
    extra_args: list[str] = Field(default_factory=list, max_length=64)
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description="Require `Authorization: Bearer <key>` on the server's API, the key read from this Secret "
        "(the container's PREHEAT_API_KEY). /health*, /metrics and /openapi.json stay open, so probes and "
        "Prometheus need no key. Unset: no key.",
    )

    @model_validator(mode="after")
    def _one_api_key(self) -> ServerSpec:
        if self.api_key_secret is not None and API_KEY_ENV in self.env:
            raise ValueError("server.env sets PREHEAT_API_KEY and server.apiKeySecret sets it too: keep one (the Secret)")
        return self


class Signal(StrEnum):
    requests_per_second = "requestsPerSecond"
    tokens_per_second = "tokensPerSecond"
    concurrency = "concurrency"


class Mode(StrEnum):
    auto = "Auto"
    preview = "Preview"


class ForecastingSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel("!has(self.horizonSeconds) || !has(self.leadTimeSeconds)",
                     "scaling.forecasting: set leadTimeSeconds, or its old spelling horizonSeconds, not both"),
            ]
        }
    )

    enabled: bool = Field(default=True, description="false = reactive only (no pre-scaling).")
    seasonality_seconds: int | None = Field(
        default=None, ge=1,
        description="Period of the load's cycle in the load's clock (e.g. 86400); default: one day.",
    )
    lead_time_seconds: float | None = Field(
        default=None, gt=0,
        description="Override the lead time (default: cold start p90 + interval + the signal's lag).",
    )
    horizon_seconds: float | None = Field(
        default=None, gt=0,
        description="Deprecated: the old spelling of leadTimeSeconds, read as leadTimeSeconds in v1alpha1 "
        "(a Warning Event says so); it goes in the next version.",
    )
    forecaster: str | None = Field(default=None, description="Forecaster name (default: the policy's).")
    window_seconds: float | None = Field(
        default=None, gt=0,
        description="Size serving for the forecast peak over this window when it is longer than the lead time: "
        "a daily ramp is pre-scaled earlier, for more replica-seconds.",
    )
    time_compression: float = Field(
        default=1.0, ge=1.0, le=100000.0,
        description="Replays and experiments: the load runs this many times faster than real time. The "
        "forecaster runs on the load's clock (its time constants and seasonalitySeconds are in load seconds); "
        "1 = real time.",
    )

    @model_validator(mode="after")
    def _old_spelling(self) -> ForecastingSpec:
        # One field in Python: the old spelling is read into the new one, so both parse to the same spec.
        if self.horizon_seconds is not None:
            if self.lead_time_seconds is not None:
                raise ValueError("scaling.forecasting: set leadTimeSeconds, or its old spelling horizonSeconds, not both")
            self.lead_time_seconds, self.horizon_seconds = self.horizon_seconds, None
        return self


class WarmPoolSpec(_Model):
    """Loaded, Ready replicas kept outside the Service so a promotion adds capacity in seconds."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel("self.min <= self.max", "scaling.warmPool.min must be <= scaling.warmPool.max")
            ]
        }
    )

    min: int = Field(
        default=0, ge=0, le=1000,
        description="Warm replicas kept whatever the forecast says. Default 0: the policy keeps warm replicas "
        "where they pay (the forecast's margin, and replicas the queue promoted, on loan, when costFraction is "
        "below what a warm replica is worth: the cold start's share of the lead time).",
    )
    max: int = Field(default=2, ge=0, le=1000)
    burst_memory_seconds: int = Field(
        default=0, ge=0, le=3600,
        description="Burst envelope (0 = off): on bursty traffic keep serving + warm at the highest short-window "
        "need of the last this-many seconds; the extra replicas wait in the warm pool (capped by max) and are "
        "promoted in seconds when the next burst queues. Lapses this long after the last burst.",
    )
    resources: ResourcesSpec | None = Field(
        default=None,
        description="CPU endpoints: the cpu and memory requests/limits of a warm replica, laid over `resources`. "
        "A pod starts (and loads its model) at the serving size; once Ready in the warm pool the operator resizes "
        "it in place (the pod resize subresource: no restart) to this size, and back before a promotion. Each "
        "value must be at most the serving one, memory not below it either (the model stays loaded: set memory "
        "only to repeat it), and the QoS class must stay the same.",
    )
    memory_cost_per_gib: float = Field(
        default=MEMORY_COST_PER_GIB, ge=0.0, le=100.0,
        description="The price of one GiB of memory in CPU cores, for the warm pool's cost fraction (default: "
        "GCP's on-demand N2 list, $0.004237 per GiB-hour / $0.031611 per vCPU-hour).",
    )
    cost_fraction: float | None = Field(
        default=None, gt=0.0, le=1.0,
        description="What a warm replica costs relative to a serving one. Default: from warmPool.resources "
        "(requests priced as cores + GiB x memoryCostPerGib), 1.0 without them (a GPU held idle costs the same). "
        "Serving is sized by the point forecast at the target utilization. The forecast's safety margin waits in "
        "the warm pool only where a warm replica costs less than it is worth: it serves a surprise only once the "
        "signal shows it and a decision promotes it, so it is worth "
        "the cold start's share of the lead time ((lead - decision interval - rate window - scrape) / lead: "
        "0.75 at a 300 s cold start, 0 at 30 s with the defaults). Elsewhere (and always at 1) the policy is the "
        "one it runs at 1.",
    )
    burst_threshold: float = Field(
        default=1.5, ge=1.0, le=10.0,  # PolicyConfig.burst_threshold (a test keeps them equal)
        description="A decision is a burst when the short-window (panic window) need is at least this many "
        "times the stable-window need, or requests wait while every slot is busy.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> WarmPoolSpec:
        if self.min > self.max:
            raise ValueError("scaling.warmPool.min must be <= scaling.warmPool.max")
        return self


class ScalingSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.minReplicas <= self.maxReplicas",
                    "scaling.minReplicas must be <= scaling.maxReplicas",
                ),
                _cel(
                    "self.targetPerReplica > 0.0",
                    "scaling.targetPerReplica must be > 0 (the signal one serving replica handles within the SLO)",
                ),
                _cel(
                    "!has(self.latencySloMs) || self.latencySloMs > 0.0",
                    "scaling.latencySloMs (the latency budget) must be > 0",
                ),
                _cel(
                    "self.minReplicas >= 1 || self.scaleToZero",
                    "scaling.minReplicas may be 0 only with scaling.scaleToZero: true",
                ),
            ]
        }
    )

    mode: Mode = Field(default=Mode.auto, description="Auto applies decisions; Preview only reports them.")
    min_replicas: int = Field(default=1, ge=0, le=10000, description="Fewest serving replicas.")
    max_replicas: int = Field(default=10, ge=1, le=10000, description="Most serving replicas.")
    signal: Signal = Field(default=Signal.requests_per_second)
    target_per_replica: float = Field(
        default=2.0, description="Signal one serving replica handles within the latency SLO."
    )
    target_utilization: float = Field(
        default=0.8, gt=0.0, le=1.0,  # PolicyConfig.target_utilization (a test keeps them equal)
        description="Share of targetPerReplica a serving replica is planned to carry: 1 - this is the headroom "
        "(Knative's target-utilization-percentage / 100). It also prices the scale-down hold (1 + 1/U lead times "
        "when forecasting, one lead time once the forecaster has learned the season). The knob to tune until the "
        "SLO holds: `preheat frontier` sweeps it, and its Preheat "
        "point at U is this spec with targetUtilization U and targetPerReplica the replica's capacity.",
    )
    latency_slo_ms: float | None = Field(
        default=None,
        description="Deprecated, ignored: no decision reads a latency budget (the policy sizes serving by "
        "targetPerReplica, the signal one replica handles within it). Accepted in v1alpha1 with a Warning "
        "Event; it goes in the next version.",
    )
    forecasting: ForecastingSpec = _sub(ForecastingSpec)
    warm_pool: WarmPoolSpec = _sub(WarmPoolSpec)
    scale_down_stabilization_seconds: int | None = Field(
        default=None, ge=0, le=86400,
        description="Scale-down stabilization window. Default: 300 s (HPA's); when forecasting 1 + 1/U lead times, U "
        "the target utilization: two at U = 1 (capacity given back costs a lead time of start-up and a lead time of "
        "unserved demand to get back, that demand priced at the 1/U replicas that serve it with the headroom); one lead "
        "time once the forecaster has learned the load's season (demand that comes back with the season is "
        "forecast and ordered ahead, so only the start-up is paid again); with a noise floor instead of HPA's "
        "300 s: a scale-down goes no lower than the signal plus 3 standard deviations "
        "of its noise needs. A value set here is exactly the window, with no noise floor.",
    )
    scale_to_zero: bool = Field(
        default=False,
        description="Allow minReplicas: 0. After scaleToZeroGraceSeconds of zero traffic, with no traffic forecast "
        "within the lead time, the endpoint goes to zero serving replicas; its Service then points at an activator "
        "(one small pod, `preheat activator`) that holds and counts the requests, so the first one wakes the endpoint "
        "and is answered a cold start later (as with Knative's activator), and a forecast of traffic wakes it ahead. "
        "Pays where the cold start is short against the idle spans: measured in the simulator (README, "
        "bench-heldout) on traffic with idle troughs.",
    )
    scale_to_zero_grace_seconds: float = Field(
        default=600.0, ge=0.0, le=86400.0,
        description="Zero traffic for this long before scaling to zero (scaleToZero; Knative's "
        "scale-to-zero-grace-period, KEDA's cooldownPeriod).",
    )
    interval_seconds: float = Field(
        default=15.0, ge=1.0, le=600.0, description="Autoscaling loop period (decision interval)."
    )

    @model_validator(mode="after")
    def _bounds(self) -> ScalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("scaling.minReplicas must be <= scaling.maxReplicas")
        if not self.target_per_replica > 0:
            raise ValueError(
                "scaling.targetPerReplica must be > 0 (the signal one serving replica handles within the SLO)"
            )
        if self.latency_slo_ms is not None and not self.latency_slo_ms > 0:
            raise ValueError("scaling.latencySloMs (the latency budget) must be > 0")
        if self.min_replicas < 1 and not self.scale_to_zero:
            raise ValueError("scaling.minReplicas may be 0 only with scaling.scaleToZero: true")
        return self


class PrometheusQueries(_Model):
    """PromQL overrides. `$namespace` and `$endpoint` are substituted; each must return one number."""

    rate: str | None = Field(default=None, description="Requests/s arriving (signal requestsPerSecond).")
    tokens: str | None = Field(default=None, description="Tokens/s (signal tokensPerSecond).")
    concurrency: str | None = Field(default=None, description="Requests in flight (signal concurrency).")
    queue: str | None = Field(default=None, description="Requests waiting for a slot.")
    latency: str | None = Field(
        default=None,
        description="Deprecated, ignored (the latency budget it served is not read by any decision); "
        "accepted in v1alpha1 with a Warning Event.",
    )


class PrometheusSpec(_Model):
    url: str | None = Field(default=None, description="Override the operator's --prometheus-url.")
    window: str = Field(default="1m", pattern=r"^[0-9]+(ms|s|m|h)$", description="Stable rate window.")
    panic_window: str = Field(
        default="20s", pattern=r"^[0-9]+(ms|s|m|h)$", description="Short window for the panic signal."
    )
    queries: PrometheusQueries = _sub(PrometheusQueries)


# CEL mirrors of the warm pool's rules the API server can check without the operator (the others,
# with both values in the message, are the operator's: `warm_size.problems`).
_WARM = "self.scaling.warmPool.resources"


def _memory_not_below(kind: str) -> str:
    warm, serving = f"{_WARM}.{kind}", f"self.resources.{kind}"
    return (f"!has({warm}) || !('memory' in {warm}) || !('memory' in {serving}) || "
            f"!isQuantity(string({warm}['memory'])) || !isQuantity(string({serving}['memory'])) || "
            f"quantity(string({warm}['memory'])).compareTo(quantity(string({serving}['memory']))) >= 0")


class InferenceEndpointSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(f"!has({_WARM}) || self.accelerator.type != 'gpu'",
                     "scaling.warmPool.resources is for CPU endpoints: a warm GPU replica keeps its GPU, so resizing its CPU and memory would not make it cheap"),
                _cel(f"!has({_WARM}) || (({_memory_not_below('requests')}) && ({_memory_not_below('limits')}))",
                     "scaling.warmPool.resources memory must not be below the serving memory (resources): a warm replica keeps its model loaded, and memory cannot shrink under a running process"),
            ]
        }
    )

    model: ModelSpec
    accelerator: AcceleratorSpec = _sub(AcceleratorSpec)
    resources: ResourcesSpec = _sub(ResourcesSpec)
    server: ServerSpec = _sub(ServerSpec)
    scaling: ScalingSpec = _sub(ScalingSpec)
    prometheus: PrometheusSpec = _sub(PrometheusSpec)

    @model_validator(mode="after")
    def _warm_size(self) -> InferenceEndpointSpec:
        warm = self.scaling.warm_pool.resources
        if warm is None:
            return self
        if self.accelerator.type is AcceleratorType.gpu:
            raise ValueError("scaling.warmPool.resources is for CPU endpoints: a warm GPU replica keeps its GPU, so resizing its CPU and memory would not make it cheap")
        try:
            serving = warm_size.as_resources(self.resources)
            asked = {kind: {n: str(v) for n, v in getattr(warm, kind).items()} for kind in warm_size.KINDS}
            why = warm_size.problems(serving, asked)
            shrinks = warm_size.memory_shrinks(serving, asked)
        except ValueError as exc:  # an unparseable quantity
            raise ValueError(f"resources / scaling.warmPool.resources: {exc}") from None
        if shrinks:
            raise ValueError("scaling.warmPool.resources memory must not be below the serving memory (resources): a warm replica keeps its model loaded, and memory cannot shrink under a running process")
        if why:
            raise ValueError("; ".join(why))
        return self

    def warm_cost_fraction(self) -> float:
        """What a warm replica costs relative to a serving one: warmPool.costFraction when set, else from
        warmPool.resources by the cost model in `warm_size`, else 1.0."""
        pool = self.scaling.warm_pool
        if pool.cost_fraction is not None:
            return pool.cost_fraction
        if pool.resources is None:
            return 1.0
        return warm_size.cost_fraction(warm_size.as_resources(self.resources), warm_size.as_resources(pool.resources),
                                       pool.memory_cost_per_gib)


_DURATION = re.compile(r"^(\d+)(ms|s|m|h)$")


def duration_s(text: str) -> float:
    """Seconds of a Prometheus duration as the spec writes it (prometheus.window: "1m", "20s")."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


# Fields v1alpha1 still accepts but no longer reads under that name: where each went. The reconcile
# handler posts one Warning Event per field set (`deprecated_fields`).
DEPRECATED_FIELDS = {
    ("scaling", "forecasting", "horizonSeconds"): "renamed scaling.forecasting.leadTimeSeconds (read as that "
    "in v1alpha1; the old spelling goes in the next version)",
    ("scaling", "latencySloMs"): "ignored: no decision reads a latency budget (serving is sized by "
    "targetPerReplica); remove it, it goes in the next version",
    ("prometheus", "queries", "latency"): "ignored: the latency query fed no decision and is no longer run; "
    "remove it, it goes in the next version",
}


def deprecated_fields(raw: dict[str, Any] | None) -> list[str]:
    """One line per deprecated field set in a CR's raw `.spec` (the parsed spec no longer knows the old
    spellings): what it became."""
    out = []
    for path, what in DEPRECATED_FIELDS.items():
        node: Any = raw or {}
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            out.append(f"spec.{'.'.join(path)} is deprecated: {what}")
    return out


def parse_spec(raw: dict[str, Any]) -> InferenceEndpointSpec:
    """Validate a CR's `.spec`; raises pydantic.ValidationError with field paths on bad input."""
    return InferenceEndpointSpec.model_validate(raw or {})


def describe_error(exc: Exception) -> str:
    """One readable line for a spec error: what users see in the Ready condition and the Event."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        parts = []
        for err in errors():
            loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}" if loc else msg)
        return "; ".join(parts)
    return str(exc)
