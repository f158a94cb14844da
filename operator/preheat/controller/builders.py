"""Pure manifest builders: (endpoint name, namespace, spec, owner) in, Kubernetes object dicts out.

No I/O here, so unit tests read the manifests directly. Labels and annotations follow
docs/ARCHITECTURE.md: the role label (warm/serving) is in the pod template but never in the
Deployment's selector, because the operator changes it at run time to promote and demote pods.
"""

from __future__ import annotations

from typing import Any

from preheat.controller import warm_size
from preheat.controller.spec import API_KEY_ENV, FETCHED_MODEL_PATH, AcceleratorType, InferenceEndpointSpec

SERVER_IMAGE = "preheat/model-server"
SERVER_IMAGE_CUDA = "preheat/model-server-cuda"
CONTAINER = "model-server"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_ENDPOINT = "preheat.dev/endpoint"
LABEL_ROLE = "preheat.dev/role"
ROLE_WARM = "warm"
ROLE_SERVING = "serving"
APP_NAME = "preheat-model-server"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# ReplicaSets remove the lowest cost first: warm pods go before serving ones.
COST_SERVING = "1000"
COST_WARM = "0"
# Seconds a stopping pod waits (preStop) before SIGTERM so every client has seen it leave the
# EndpointSlice; then the server drains in-flight requests for drain_timeout_seconds.
PRESTOP_SECONDS = 2
# model.uri: an init container downloads the weights into an emptyDir before the server starts
# (KServe's storage-initializer pattern); with cacheOnNode into a per-node hostPath it links to.
FETCH_CONTAINER = "fetch-model"
MODEL_STORE_VOLUME = "model-store"
MODEL_STORE_DIR = FETCHED_MODEL_PATH.rsplit("/", 1)[0]
FETCH_RECORD = f"{MODEL_STORE_DIR}/.preheat-fetch.json"
MODEL_CACHE_VOLUME = "model-cache"
NODE_CACHE_DIR = "/var/cache/preheat/models"
# The image's non-root user (model-server/Dockerfile: USER 65532:65532).
IMAGE_UID = 65532
TMP_VOLUME = "tmp"


def operator_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("preheat")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
        return "0.1.0"


def workload_name(endpoint: str) -> str:
    """Deployment, Service and PDB all share the endpoint's name (one endpoint owns one of each)."""
    return endpoint


def common_labels(endpoint: str) -> dict[str, str]:
    return {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: endpoint,
        LABEL_MANAGED_BY: "preheat",
        LABEL_ENDPOINT: endpoint,
    }


def selector_labels(endpoint: str) -> dict[str, str]:
    """The Deployment's selector: stable for the pod's life, so no role label."""
    return {LABEL_NAME: APP_NAME, LABEL_ENDPOINT: endpoint}


def serving_selector(endpoint: str) -> dict[str, str]:
    return {**selector_labels(endpoint), LABEL_ROLE: ROLE_SERVING}


def selector_string(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    """Owner reference to the InferenceEndpoint, so deleting it garbage-collects everything."""
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def server_image(spec: InferenceEndpointSpec, version: str | None = None) -> str:
    if spec.server.image:
        return spec.server.image
    repo = SERVER_IMAGE_CUDA if spec.accelerator.type is AcceleratorType.gpu else SERVER_IMAGE
    return f"{repo}:{version or operator_version()}"


def server_args(endpoint: str, spec: InferenceEndpointSpec) -> list[str]:
    """The preheat-server command line (docs/ARCHITECTURE.md), one flag per set spec field."""
    s = spec.server
    device = "cuda" if spec.accelerator.type is AcceleratorType.gpu else "cpu"
    args = [
        "--model", spec.model.server_arg,
        "--host", "$(POD_IP)",
        "--port", str(s.port),
        "--device", device,
        "--precision", str(spec.model.precision),
        "--served-model-name", spec.model.served_model_name or endpoint,
        "--drain-timeout-s", str(s.drain_timeout_seconds),
    ]  # fmt: skip
    optional = [
        ("--max-num-seqs", s.max_num_seqs),
        ("--max-num-batched-tokens", s.max_num_batched_tokens),
        ("--kv-cache-blocks", s.kv_cache_blocks),
        ("--block-size", s.block_size),
        ("--max-queue", s.max_queue),
        ("--target-itl-ms", s.target_itl_ms),
    ]
    for flag, value in optional:
        if value is not None:
            args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return args + list(s.extra_args)


def _resources(spec: InferenceEndpointSpec) -> dict[str, Any]:
    # Quantities as strings: the API accepts both, the kubernetes client's models only strings.
    requests = {k: str(v) for k, v in spec.resources.requests.items()}
    limits = {k: str(v) for k, v in spec.resources.limits.items()}
    if spec.accelerator.type is AcceleratorType.gpu:
        limits["nvidia.com/gpu"] = str(spec.accelerator.count)
        requests["nvidia.com/gpu"] = str(spec.accelerator.count)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _api_key_env(spec: InferenceEndpointSpec) -> list[dict[str, Any]]:
    """server.apiKeySecret as the server's $PREHEAT_API_KEY, read from the Secret by the kubelet: the key
    never appears in the Deployment. The probes (/health/*) and Prometheus' /metrics scrape stay open."""
    ref = spec.server.api_key_secret
    if ref is None:
        return []
    return [{"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def pod_sizes(spec: InferenceEndpointSpec) -> tuple[warm_size.Resources, warm_size.Resources] | None:
    """(serving, warm) cpu/memory of the model-server container when the warm pool is resized in place
    (scaling.warmPool.resources set), else None. Pods start at the serving size."""
    warm = spec.scaling.warm_pool.resources
    if warm is None:
        return None
    serving = warm_size.as_resources(spec.resources)
    return warm_size.defaulted(serving), warm_size.overlay(serving, warm_size.as_resources(warm))


def pod_template(endpoint: str, spec: InferenceEndpointSpec, version: str | None = None) -> dict[str, Any]:
    port = spec.server.port
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    env += [{"name": k, "value": v} for k, v in sorted(spec.server.env.items())]
    env += _api_key_env(spec)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": server_image(spec, version),
        "args": server_args(endpoint, spec),
        "env": env,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        # Ready only when the model is loaded and not draining: warm pods are Ready too, which is
        # what makes a promotion add capacity at once.
        "readinessProbe": {
            "httpGet": {"path": "/health/ready", "port": "http"},
            "periodSeconds": 2,
            "timeoutSeconds": 2,
            "failureThreshold": 2,
        },
        # Live while loading (a slow model load must not be killed as a hang).
        "livenessProbe": {
            "httpGet": {"path": "/health/live", "port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
        # The server writes why it stopped (e.g. "model path /x does not exist") here; the operator
        # surfaces it in the Ready condition and an Event.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    if spec.scaling.warm_pool.resources is not None:
        # The warm pool's in-place resize must never restart the server (it would reload the model).
        container["resizePolicy"] = [{"resourceName": n, "restartPolicy": "NotRequired"} for n in warm_size.RESIZABLE]
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": PRESTOP_SECONDS + spec.server.drain_timeout_seconds + 5,
        # Replicas spread over nodes where there is room, so losing one node loses part of the fleet,
        # not all of it; ScheduleAnyway: never left Pending for the sake of the spread.
        "topologySpreadConstraints": [{
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector_labels(endpoint)},
        }],
    }
    if spec.accelerator.node_selector:
        pod_spec["nodeSelector"] = dict(spec.accelerator.node_selector)
    if spec.accelerator.tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in spec.accelerator.tolerations
        ]
    if spec.model.uri is not None:
        _add_fetch(pod_spec, container, spec, version)
    if spec.model.persistent_volume_claim:
        pod_spec["volumes"] = [
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": spec.model.persistent_volume_claim, "readOnly": True},
            }
        ]
        container["volumeMounts"] = [{"name": "model", "mountPath": spec.model.mount_path, "readOnly": True}]
    _restrict(pod_spec, container)
    return {
        "metadata": {
            # New pods are born warm: outside the Service until the operator promotes them.
            "labels": {**common_labels(endpoint), LABEL_ROLE: ROLE_WARM},
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(port),
                "prometheus.io/path": "/metrics",
                DELETION_COST: COST_WARM,
            },
        },
        "spec": pod_spec,
    }


def _restrict(pod_spec: dict[str, Any], server: dict[str, Any]) -> None:
    """The server runs as the restricted Pod Security Standard asks, on a read-only root filesystem:
    what it writes (torch and tokenizer caches; the image points HOME and XDG_CACHE_HOME there) goes to
    a /tmp emptyDir."""
    server["securityContext"] = restricted_security_context()
    pod_spec["volumes"] = [*pod_spec.get("volumes", []), {"name": TMP_VOLUME, "emptyDir": {}}]
    server["volumeMounts"] = [*server.get("volumeMounts", []), {"name": TMP_VOLUME, "mountPath": "/tmp"}]


def restricted_security_context() -> dict[str, Any]:
    """What the restricted Pod Security Standard asks of a container (readOnlyRootFilesystem beyond it)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": IMAGE_UID,
        "runAsGroup": IMAGE_UID,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def fetch_args(spec: InferenceEndpointSpec) -> list[str]:
    """preheat-fetch's command line for model.uri (model-server/preheat_server/fetch.py)."""
    m = spec.model
    args = [str(m.uri), FETCHED_MODEL_PATH, "--record", FETCH_RECORD]
    if m.sha256:
        args += ["--sha256", m.sha256]
    if m.cache_on_node:
        args += ["--cache-dir", NODE_CACHE_DIR]
    return args


def _add_fetch(pod_spec: dict[str, Any], server: dict[str, Any], spec: InferenceEndpointSpec,
               version: str | None) -> None:
    """The init container that downloads model.uri, and the volumes it shares with the server."""
    store = {"name": MODEL_STORE_VOLUME, "mountPath": MODEL_STORE_DIR}
    mounts = [store]
    volumes: list[dict[str, Any]] = [{"name": MODEL_STORE_VOLUME, "emptyDir": {}}]
    if spec.model.cache_on_node:
        # The store holds a symlink into the cache, so the server mounts the cache at the same path.
        mounts.append({"name": MODEL_CACHE_VOLUME, "mountPath": NODE_CACHE_DIR})
        volumes.append({"name": MODEL_CACHE_VOLUME,
                        "hostPath": {"path": NODE_CACHE_DIR, "type": "DirectoryOrCreate"}})
    fetch: dict[str, Any] = {
        "name": FETCH_CONTAINER,
        "image": server_image(spec, version),
        "command": ["preheat-fetch"],
        "args": fetch_args(spec),
        "volumeMounts": mounts,
        "securityContext": restricted_security_context(),
        # preheat-fetch's last line (e.g. "GET ...: HTTP 404 Not Found") becomes the termination
        # message, which the operator puts in the Ready condition and an Event.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    # The same CPU and memory as the server (a pod's request is the larger of the two anyway), so a
    # namespace's LimitRange or quota treats both alike; never the GPUs: a download needs none.
    resources = {kind: {k: v for k, v in amounts.items() if k != "nvidia.com/gpu"}
                 for kind, amounts in _resources(spec).items()}
    if any(resources.values()):
        fetch["resources"] = {k: v for k, v in resources.items() if v}
    pod_spec["initContainers"] = [fetch]
    pod_spec["volumes"] = volumes
    server["volumeMounts"] = [{**m, "readOnly": True} for m in mounts]
    server["env"].append({"name": "PREHEAT_FETCH_RECORD", "value": FETCH_RECORD})


def initial_replicas(spec: InferenceEndpointSpec) -> int:
    """Replicas at creation: the serving floor plus the warm pool's minimum, within maxReplicas
    (the policy bounds serving + warm by maxReplicas too)."""
    s = spec.scaling
    return max(s.min_replicas, min(s.max_replicas, s.min_replicas + s.warm_pool.min))


def owned_metadata(endpoint: str, namespace: str, owner: dict[str, Any]) -> dict[str, Any]:
    """Metadata shared by every object the operator creates for an endpoint: one name, the common
    labels, and the owner reference that lets the garbage collector delete it with the endpoint."""
    return {
        "name": workload_name(endpoint),
        "namespace": namespace,
        "labels": common_labels(endpoint),
        "ownerReferences": [owner_reference(owner)],
    }


def deployment(
    endpoint: str,
    namespace: str,
    spec: InferenceEndpointSpec,
    owner: dict[str, Any],
    replicas: int | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    """The model server's Deployment. `replicas=None` leaves replicas to the autoscaling loop."""
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": owned_metadata(endpoint, namespace, owner),
        "spec": {
            "selector": {"matchLabels": selector_labels(endpoint)},
            # A rollout never takes serving capacity away before the new pod is Ready.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "revisionHistoryLimit": 3,
            "template": pod_template(endpoint, spec, version),
        },
    }
    if replicas is not None:
        body["spec"]["replicas"] = replicas
    return body


def service(endpoint: str, namespace: str, spec: InferenceEndpointSpec, owner: dict[str, Any]) -> dict[str, Any]:
    """Selects serving pods only: warm pods are Ready but receive no traffic."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owned_metadata(endpoint, namespace, owner),
        "spec": {
            "type": "ClusterIP",
            "selector": serving_selector(endpoint),
            "ports": [{"name": "http", "port": spec.server.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def pod_disruption_budget(
    endpoint: str, namespace: str, spec: InferenceEndpointSpec, owner: dict[str, Any]
) -> dict[str, Any]:
    """Voluntary disruptions (drains) take at most one serving pod at a time; warm pods are free."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": owned_metadata(endpoint, namespace, owner),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": serving_selector(endpoint)}},
    }
