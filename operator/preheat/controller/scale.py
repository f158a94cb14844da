"""Scale: apply one step's plan to the cluster, and write the endpoint's status.

Promotions and demotions first (capacity in seconds; removal from the Service before any pod stops),
then the Deployment's replicas (its ReplicaSet removes the cheapest pods by deletion cost: the warm
ones). The plan was computed from the pods as they are (`actuation.plan`), so a retried or restarted
step recomputes the same plan and never promotes twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from preheat.controller import actuation, metrics, routing
from preheat.controller.builders import workload_name
from preheat.controller.kube import shared_api
from preheat.controller.spec import GROUP, PLURAL, VERSION

T = TypeVar("T")
log = logging.getLogger("preheat.scale")


def retry_conflict(fn: Callable[[], T], attempts: int = 5) -> T | None:
    """Run fn(); on 409 Conflict try again (someone else wrote first: re-read happens inside fn)."""
    for i in range(attempts):
        try:
            return fn()
        except ApiException as exc:
            if exc.status != 409 or i == attempts - 1:
                raise
            time.sleep(0.05 * (2**i))
    return None


def resize(namespace: str, name: str, resizes: tuple[actuation.PodResize, ...]) -> None:
    """In-place resizes through the pod `resize` subresource (the kubelet changes the cgroup; nothing
    restarts). A refused resize does not stop the step: a promotion at the warm size still adds capacity,
    and the next step retries; it is logged and counted (preheat_resizes_total{outcome="error"})."""
    core = client.CoreV1Api(shared_api())
    for r in resizes:
        direction = "up" if r.up else "down"
        try:
            core.patch_namespaced_pod_resize(r.name, namespace, r.body())
        except ApiException as exc:
            if exc.status == 404:  # the pod went away meanwhile; the next step sees it
                continue
            log.warning("%s/%s: resizing pod %s %s refused (%s): %s", namespace, name, r.name, direction,
                        exc.status, (exc.body or exc.reason or "")[:300])
            metrics.resizes.labels(namespace, name, direction, "error").inc()
            continue
        metrics.resizes.labels(namespace, name, direction, "ok").inc()


def scale(namespace: str, name: str, plan: actuation.Plan) -> None:
    """Resizes up (a pod about to serve gets its full size first), the pod patches (role label, deletion
    cost), resizes down (a pod shrinks once out of the Service), then the Deployment's replicas."""
    core, apps = client.CoreV1Api(shared_api()), client.AppsV1Api(shared_api())
    resize(namespace, name, plan.resize_up)
    for patch in plan.patches():
        try:
            retry_conflict(lambda p=patch: core.patch_namespaced_pod(p.name, namespace, p.body()))
        except ApiException as exc:
            if exc.status != 404:  # 404: the pod went away meanwhile; the next step sees it
                raise
    resize(namespace, name, plan.resize_down)
    if plan.replicas is not None:
        retry_conflict(lambda: apps.patch_namespaced_deployment_scale(
            workload_name(name), namespace, {"spec": {"replicas": plan.replicas}}))


def route(namespace: str, name: str, to_activator: bool, selector: dict[str, str] | None) -> str | None:
    """Point the endpoint's public Service at the activator or at the serving pods (routing.py); the
    message of an Event when it changed, None when it already pointed there. `selector`: the Service's
    selector as this step's collect read it."""
    core = client.CoreV1Api(shared_api())
    want = routing.public_selector(name, to_activator)
    if (selector or {}) == want:
        return None
    # A merge patch would keep the other selector's keys: replace the selector whole.
    core.patch_namespaced_service(workload_name(name), namespace,
                                  [{"op": "replace", "path": "/spec/selector", "value": want}])
    return ("no serving replica: requests go to the activator, which holds them until one serves" if to_activator
            else "a replica serves: requests go to the serving pods")


def write_status(namespace: str, name: str, status: dict[str, Any]) -> None:
    api = client.CustomObjectsApi(shared_api())
    try:
        retry_conflict(lambda: api.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}))
    except ApiException as exc:
        if exc.status != 404:  # deleted meanwhile
            raise
