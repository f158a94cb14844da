"""Kopf handlers: thin glue from InferenceEndpoint events to the builders, the loop and the API.

- create/update/resume -> `reconcile`: build Deployment/Service/PDB, create what is missing and bring
  what drifted back to the built form (idempotent; a template change rolls the Deployment, nothing
  else does).
- one daemon per endpoint -> `autoscale`: runs `loop.Controller.step` every interval in a worker
  thread and posts the Events it returns.
Both parse the spec once per event or step, in `_parsed`, the one path that writes the InvalidSpec
status; what they call gets the parsed spec. Importing this module registers the handlers on Kopf's
default registry.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as ConnectionFailure

from preheat.controller import builders, metrics, routing
from preheat.controller import status as st
from preheat.controller.kube import shared_api
from preheat.controller.loop import Controller
from preheat.controller.scale import retry_conflict
from preheat.controller.spec import (
    GROUP,
    PLURAL,
    VERSION,
    InferenceEndpointSpec,
    deprecated_fields,
    describe_error,
    parse_spec,
)

log = logging.getLogger("preheat.handlers")

TEMPLATE_HASH = "preheat.dev/template-hash"
INVALID_SPEC_RETRY_S = 30.0  # the daemon re-reads an invalid spec this often (a fix arrives as an update)


class InvalidSpec(Exception):
    """The endpoint's spec does not validate; the message says which field and why."""


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _plain(body: Any) -> dict[str, Any]:
    """A deep copy of a Kopf body view as plain dicts (safe to hand to a worker thread)."""
    return {k: copy.deepcopy(body[k]) for k in body}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Kopf's bookkeeping goes into annotations under our domain; .status stays ours alone.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="preheat.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="preheat.dev", key="last-handled-configuration"
    )
    settings.persistence.finalizer = "preheat.dev/finalizer"
    settings.posting.level = logging.INFO
    # A watch the API server ends every minute, and one that is silent for 90 s is dropped and opened
    # again: a connection that died without a word (a Service path reprogrammed under it) stalls
    # create/update handling for at most 90 s instead of 330 s. Seen once on the local cluster: a
    # freshly installed chart's active replica handled nothing for the 300 s the install test waits.
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 90
    settings.watching.connect_timeout = 15
    settings.networking.request_timeout = 30
    settings.execution.max_workers = int(memo.get("max_workers", 8))
    # Peering: when two operator replicas run, the one with higher priority acts; the other waits.
    settings.peering.priority = int(memo.get("peering_priority", 0))
    settings.peering.lifetime = int(memo.get("peering_lifetime", 60))
    # Events say which replica wrote them (kubectl get events -o wide: reportingInstance).
    settings.posting.reporting_component = "preheat-operator"
    if memo.get("identity"):
        settings.posting.reporting_instance = str(memo["identity"])[:128]


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """Kopf talks to the same API server with the same identity as the kubernetes client."""
    c = memo["credentials"]
    return kopf.ConnectionInfo(
        server=c.server,
        ca_path=c.ca_path,
        insecure=c.insecure,
        scheme="Bearer" if c.token else None,
        token=c.token,
        certificate_path=c.cert_path,
        private_key_path=c.key_path,
        default_namespace=c.namespace,
    )


def _ensure(kind: str, read: Any, create: Any, update: Any, desired: dict[str, Any], differs: Any) -> str | None:
    """Create `desired` if missing, update it if `differs(existing)`; returns what was done or None."""
    try:
        existing = read()
    except ApiException as exc:
        if exc.status != 404:
            raise
        create(desired)
        return f"created {kind} {desired['metadata']['name']}"
    if differs(existing):
        retry_conflict(lambda: update(desired))
        return f"updated {kind} {desired['metadata']['name']}"
    return None


def reconcile_objects(body: dict[str, Any], spec: InferenceEndpointSpec, activator_image: str | None = None) -> list[str]:
    """Bring the endpoint's Deployment, Service and PDB (and, with scale to zero, the activator and the
    private serving Service) to their built form. Returns actions taken."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    api = shared_api()
    core, apps, policy = client.CoreV1Api(api), client.AppsV1Api(api), client.PolicyV1Api(api)
    actions: list[str] = []

    dep = builders.deployment(name, ns, spec, body, replicas=builders.initial_replicas(spec))
    template_hash = _hash(dep["spec"]["template"])
    dep["metadata"]["annotations"] = {TEMPLATE_HASH: template_hash}

    def dep_update(desired: dict[str, Any]) -> Any:
        # Replace the template wholesale (a removed flag must disappear), never touch replicas:
        # those belong to the autoscaling loop.
        patch = [
            {"op": "replace", "path": "/spec/template", "value": desired["spec"]["template"]},
            {"op": "replace", "path": "/spec/strategy", "value": desired["spec"]["strategy"]},
            {"op": "replace", "path": "/metadata/ownerReferences", "value": desired["metadata"]["ownerReferences"]},
        ]
        apps.patch_namespaced_deployment(name, ns, patch)  # a list body is sent as a JSON patch
        return apps.patch_namespaced_deployment(
            name, ns, {"metadata": {"annotations": {TEMPLATE_HASH: template_hash}}}
        )

    done = _ensure(
        "Deployment",
        lambda: apps.read_namespaced_deployment(name, ns),
        lambda d: apps.create_namespaced_deployment(ns, d),
        dep_update,
        dep,
        lambda existing: (existing.metadata.annotations or {}).get(TEMPLATE_HASH) != template_hash
        or not existing.metadata.owner_references,
    )
    if done:
        actions.append(done)

    done = _reconcile_service(api, core, body, spec)
    if done:
        actions.append(done)
    actions += _reconcile_activator(api, core, apps, body, spec, activator_image)

    pdb = builders.pod_disruption_budget(name, ns, spec, body)
    done = _ensure(
        "PodDisruptionBudget",
        lambda: policy.read_namespaced_pod_disruption_budget(name, ns),
        lambda d: policy.create_namespaced_pod_disruption_budget(ns, d),
        lambda d: policy.patch_namespaced_pod_disruption_budget(name, ns, {"spec": d["spec"]}),
        pdb,
        lambda existing: api.sanitize_for_serialization(existing)["spec"].get("selector") != pdb["spec"]["selector"],
    )
    if done:
        actions.append(done)
    return actions


def _reconcile_service(api: Any, core: Any, body: dict[str, Any], spec: InferenceEndpointSpec) -> str | None:
    """The public Service. With an activator its selector belongs to the loop (routing.py), which swaps
    it between the activator and the serving pods: reconcile sets it at creation only."""
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    svc = builders.service(name, ns, spec, body)
    activated = routing.uses_activator(spec)
    if activated:
        svc["spec"]["selector"] = routing.public_selector(name, builders.initial_replicas(spec) == 0)

    def svc_differs(existing: Any) -> bool:
        e = api.sanitize_for_serialization(existing)
        selector = e["spec"].get("selector")
        routed = selector in (routing.activator_selector(name), builders.serving_selector(name))
        return (not routed if activated else selector != svc["spec"]["selector"]) or [
            (p.get("name"), p.get("port"), p.get("targetPort")) for p in e["spec"].get("ports", [])
        ] != [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]]

    return _ensure(
        "Service",
        lambda: core.read_namespaced_service(name, ns),
        lambda d: core.create_namespaced_service(ns, d),
        _patch_service(core, name, ns),
        svc,
        svc_differs,
    )


def _patch_service(core: Any, name: str, ns: str) -> Any:
    """A Service's update: its selector and ports (the rest is the API server's)."""
    return lambda d: core.patch_namespaced_service(name, ns, {"spec": {"selector": d["spec"]["selector"],
                                                                       "ports": d["spec"]["ports"]}})


def _reconcile_activator(api: Any, core: Any, apps: Any, body: dict[str, Any], spec: InferenceEndpointSpec,
                         image: str | None) -> list[str]:
    """The activator Deployment and the private Service it forwards to: present with scale to zero,
    removed without it."""
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    dep_name, svc_name = routing.activator_name(name), routing.serving_service_name(name)
    if not routing.uses_activator(spec):
        return [a for a in [_park_activator(apps, ns, dep_name)] if a]
    dep = routing.activator_deployment(name, ns, spec, body, image)
    svc = routing.serving_service(name, ns, spec, body)
    done = [
        _ensure("Deployment", lambda: apps.read_namespaced_deployment(dep_name, ns),
                lambda d: apps.create_namespaced_deployment(ns, d),
                lambda d: apps.patch_namespaced_deployment(dep_name, ns, {"spec": d["spec"]}), dep,
                # parked at 0 when scale to zero was off: back to one pod when it is on again
                lambda e: not e.spec.replicas
                or api.sanitize_for_serialization(e)["spec"]["template"]["spec"]["containers"][0].get("args")
                != dep["spec"]["template"]["spec"]["containers"][0]["args"]),
        _ensure("Service", lambda: core.read_namespaced_service(svc_name, ns),
                lambda d: core.create_namespaced_service(ns, d),
                _patch_service(core, svc_name, ns),
                svc, lambda e: api.sanitize_for_serialization(e)["spec"].get("selector") != svc["spec"]["selector"]),
    ]
    return [a for a in done if a]


def _park_activator(apps: Any, ns: str, dep_name: str) -> str | None:
    """Scale to zero turned off: the activator Deployment goes to zero replicas (the operator deletes
    nothing; the endpoint's deletion collects it and the idle private Service)."""
    try:
        dep = apps.read_namespaced_deployment(dep_name, ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    if not dep.spec.replicas:
        return None
    apps.patch_namespaced_deployment_scale(dep_name, ns, {"spec": {"replicas": 0}})
    return f"scaled Deployment {dep_name} to 0 (scale to zero is off)"


def _write_invalid_status(body: dict[str, Any], message: str) -> None:
    meta = body["metadata"]
    status = st.build_status(
        generation=meta.get("generation"),
        previous=dict(body.get("status") or {}),
        conditions=[st.Condition(st.READY, False, "InvalidSpec", message)],
        now=st.now_iso(),
        fields={},
    )
    try:
        client.CustomObjectsApi(shared_api()).patch_namespaced_custom_object_status(
            GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], {"status": status}
        )
    except ApiException as exc:
        log.warning("cannot write status of %s/%s: %s", meta["namespace"], meta["name"], exc)


async def _parsed(body: dict[str, Any]) -> InferenceEndpointSpec:
    """The spec of this event or step, parsed once. Invalid: Ready=False with reason InvalidSpec and
    the message in status, then InvalidSpec is raised (the caller decides whether to retry)."""
    try:
        return parse_spec(body.get("spec") or {})
    except Exception as exc:  # ValidationError with field paths; anything else is reported the same way
        message = describe_error(exc)
        await asyncio.to_thread(_write_invalid_status, body, message)
        raise InvalidSpec(message) from exc


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def reconcile(body: kopf.Body, logger: logging.Logger, memo: kopf.Memo, **_: Any) -> None:
    plain = _plain(body)
    try:
        spec = await _parsed(plain)
    except InvalidSpec as exc:
        # One Warning Event per rejected spec (the daemon only keeps the status current).
        kopf.warn(body, reason="InvalidSpec", message=str(exc))
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    with metrics.reconcile_duration.time():
        try:
            image = memo["controller"].options.activator_image if "controller" in memo else None
            actions = await asyncio.to_thread(reconcile_objects, plain, spec, image)
        except (ApiException, ConnectionFailure) as exc:
            # An API error, or the API server not reached at all (refused, reset, timed out), is retried
            # in 5 s, not after Kopf's 60 s default for unexpected errors: a freshly started operator
            # whose first connection fails would leave a new endpoint without a Deployment for a minute.
            metrics.reconciles.labels("error").inc()
            why = (f"API error {exc.status}: {exc.reason}" if isinstance(exc, ApiException)
                   else f"API server unreachable: {exc}")
            raise kopf.TemporaryError(why, delay=5) from exc
    metrics.reconciles.labels("success").inc()
    for message in deprecated_fields(plain.get("spec")):  # once per create/update/resume of the spec
        kopf.warn(body, reason="DeprecatedField", message=message)
        logger.warning(message)
    for action in actions:
        kopf.info(body, reason="Reconciled", message=action)
        logger.info(action)


async def _autoscale_step(loop: Controller, body: kopf.Body, logger: logging.Logger) -> float:
    """One step of the endpoint's loop (counted and timed); returns the seconds until the next."""
    plain = _plain(body)
    try:
        spec = await _parsed(plain)
    except InvalidSpec:
        return INVALID_SPEC_RETRY_S
    with metrics.autoscale_step_duration.time():
        try:
            result = await asyncio.to_thread(loop.step, plain, spec)
        except Exception:
            metrics.autoscale_steps.labels("error").inc()
            raise
    metrics.autoscale_steps.labels("success").inc()
    for ev in result.events:
        kopf.event(body, type=ev.type, reason=ev.reason, message=ev.message[:1024])
        logger.info("%s: %s", ev.reason, ev.message)
    return result.sleep_s


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def autoscale(body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo,
                    logger: logging.Logger, **_: Any) -> None:
    """The autoscaling loop of one endpoint. Errors back off and retry; they never end the loop."""
    loop: Controller = memo["controller"]
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    errors = 0
    try:
        while not stopped:
            try:
                sleep = await _autoscale_step(loop, body, logger)
                errors = 0
            except Exception as exc:  # API hiccup, 409 storm, a bug: log, back off, keep going
                errors += 1
                sleep = min(60.0, 2.0 ** min(errors, 6))
                logger.exception("autoscaling step failed (%d in a row), retrying in %.0fs: %s", errors, sleep, exc)
            await stopped.wait(sleep)
    finally:
        loop.forget(ns, name)
