"""Routing: where an endpoint's Service sends requests, its serving pods or, at zero, the activator.

An endpoint with `scaling.scaleToZero` gets two more objects: a private Service `<name>-serving` that
always selects the serving pods, and an activator Deployment (`preheat activator`, one small pod from
the operator's image) that holds and counts requests and forwards them to that private Service. While
no serving pod is Ready, or the decision is zero, the public Service selects the activator; once one
serves, it selects the serving pods again (Knative's serverless service swaps its endpoints the same
way). Pure: the builders and the routing rule; `loop.py` and `handlers.py` do the API calls.

The activator's pod carries no `preheat.dev/endpoint` label: Prometheus maps that label to
`endpoint` on the target, and the operator counts `up{endpoint=...}` as model-server targets. Its
metrics carry their own `endpoint` label instead (observe.py reads them only while no model-server
target exists).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from preheat.controller.builders import (
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    operator_version,
    owned_metadata,
    restricted_security_context,
    serving_selector,
)
from preheat.controller.spec import InferenceEndpointSpec, Mode
from preheat.scaling.policy.types import Decision

ACTIVATOR_IMAGE = "preheat/operator"
ACTIVATOR_APP = "preheat-activator"
LABEL_ACTIVATOR_FOR = "preheat.dev/activator-for"
ACTIVATOR_PORT = 8012
# How long the activator holds a request for a serving replica: above a large model's cold start
# (minutes), below a client's patience of about ten.
HOLD_TIMEOUT_S = 600


def uses_activator(spec: InferenceEndpointSpec) -> bool:
    return spec.scaling.scale_to_zero


def activator_name(endpoint: str) -> str:
    return f"{endpoint}-activator"


def serving_service_name(endpoint: str) -> str:
    return f"{endpoint}-serving"


def activator_selector(endpoint: str) -> dict[str, str]:
    return {LABEL_NAME: ACTIVATOR_APP, LABEL_ACTIVATOR_FOR: endpoint}


def activator_image(version: str | None = None) -> str:
    return f"{ACTIVATOR_IMAGE}:{version or operator_version()}"


@dataclass(frozen=True)
class ActivatorSeen:
    """The activator as a step found it."""

    ready: bool  # its Deployment has a Ready pod
    routed: bool  # the public Service selects it
    selector: dict[str, str] | None = None  # the public Service's selector as read (route() compares it)


@dataclass(frozen=True)
class Gate:
    """A decision as it may be applied with the activator in the way."""

    decision: Decision
    route_first: bool  # the Service goes to the activator this step (the decision wants zero)
    blocked: str | None = None  # why zero waits for the activator, when it is not Ready


def gate(decision: Decision, seen: ActivatorSeen | None) -> Gate:
    """Zero serving replicas only once the activator takes the requests. A decision of zero while the
    activator is not Ready keeps one replica (with nobody to hold them, requests at zero would be
    refused); while the public Service does not select it yet, the step routes to it and keeps one
    replica until the next step, so every node's kube-proxy has an interval to send new requests to
    the activator before the last serving pod goes."""
    if seen is None or decision.serving > 0:
        return Gate(decision, False)
    if not seen.ready:
        why = "the activator is not Ready (its Deployment has no Ready pod): keeping one serving replica"
        return Gate(replace(decision, serving=1, detail=f"{decision.detail}; {why}"), False, why)
    if not seen.routed:
        note = "requests go to the activator first: zero on the next step"
        return Gate(replace(decision, serving=1, detail=f"{decision.detail}; {note}"), True)
    return Gate(decision, True)


def to_activator(spec: InferenceEndpointSpec, serving_ready: int, route_first: bool) -> bool | None:
    """Where the public Service points after a step; None: the endpoint has no activator. To the
    activator while no serving pod is Ready, or once the decision is zero (`gate`); in Preview the
    decision is only reported (every Ready pod serves), so the Ready serving pods alone decide."""
    if not uses_activator(spec):
        return None
    return serving_ready == 0 or (route_first and spec.scaling.mode is not Mode.preview)


def public_selector(endpoint: str, to_activator: bool) -> dict[str, str]:
    return activator_selector(endpoint) if to_activator else serving_selector(endpoint)


def serving_service(endpoint: str, namespace: str, spec: InferenceEndpointSpec, owner: dict[str, Any]) -> dict[str, Any]:
    """The private Service the activator forwards to: always the serving pods."""
    meta = owned_metadata(endpoint, namespace, owner) | {"name": serving_service_name(endpoint)}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "selector": serving_selector(endpoint),
            "ports": [{"name": "http", "port": spec.server.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def activator_args(endpoint: str, namespace: str, spec: InferenceEndpointSpec) -> list[str]:
    upstream = f"http://{serving_service_name(endpoint)}.{namespace}.svc:{spec.server.port}"
    return ["activator", "--upstream", upstream, "--endpoint", endpoint, "--port", str(ACTIVATOR_PORT),
            "--hold-timeout-seconds", str(HOLD_TIMEOUT_S)]


def activator_deployment(endpoint: str, namespace: str, spec: InferenceEndpointSpec, owner: dict[str, Any],
                         image: str | None = None) -> dict[str, Any]:
    """One activator pod (the operator's image, `preheat activator`). Its container port is named
    `http` like the model server's, so the public Service's `targetPort: http` fits both."""
    labels = {**activator_selector(endpoint), LABEL_INSTANCE: endpoint, LABEL_MANAGED_BY: "preheat"}
    container = {
        "name": "activator",
        "image": image or activator_image(),
        "command": ["preheat"],  # the image's ENTRYPOINT is `preheat operator`
        "args": activator_args(endpoint, namespace, spec),
        "ports": [{"name": "http", "containerPort": ACTIVATOR_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": restricted_security_context(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],  # HOME in the image; the root is read-only
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": owned_metadata(endpoint, namespace, owner) | {"name": activator_name(endpoint), "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": activator_selector(endpoint)},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(ACTIVATOR_PORT),
                                    "prometheus.io/path": "/metrics"},
                },
                # Held requests finish (or time out) before the pod goes.
                "spec": {"containers": [container], "terminationGracePeriodSeconds": HOLD_TIMEOUT_S + 5,
                         "volumes": [{"name": "tmp", "emptyDir": {}}]},
            },
        },
    }
