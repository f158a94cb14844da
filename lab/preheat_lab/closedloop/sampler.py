"""Record the endpoint every few seconds: its status (rate, forecast, replicas) and its pods by role."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from .metrics import PodView, Sample

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "preheat.dev", "v1alpha1", "inferenceendpoints"
ROLE_LABEL = "preheat.dev/role"
ENDPOINT_LABEL = "preheat.dev/endpoint"


def pod_view(pod: Any, t0_wall: float) -> PodView:
    """A kubernetes-client V1Pod as a PodView on the experiment clock (seconds since t0_wall)."""
    meta, status = pod.metadata, pod.status
    cond = next((c for c in (status.conditions or []) if c.type == "Ready"), None)
    ready = cond is not None and cond.status == "True"
    since = cond.last_transition_time.timestamp() - t0_wall if ready and cond.last_transition_time else None
    created = meta.creation_timestamp.timestamp() - t0_wall if meta.creation_timestamp else 0.0
    return PodView(
        uid=meta.uid,
        name=meta.name,
        role=(meta.labels or {}).get(ROLE_LABEL, ""),
        ready=ready,
        created_s=created,
        deleting=meta.deletion_timestamp is not None,
        ready_since_s=since,
    )


class Sampler:
    """Lists the endpoint's pods and reads its status every `interval_s` into `samples`."""

    def __init__(self, api_client: Any, namespace: str, endpoint: str, interval_s: float = 2.0):
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace, self.endpoint, self.interval_s = namespace, endpoint, interval_s
        self.samples: list[Sample] = []
        self.t0_wall = time.time()
        self.errors = 0
        self._task: asyncio.Task | None = None

    def now(self) -> float:
        return time.time() - self.t0_wall

    def sample_once(self) -> Sample:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{ENDPOINT_LABEL}={self.endpoint}", _request_timeout=5
        ).items
        try:
            obj = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.endpoint, _request_timeout=5
            )
            status = dict(obj.get("status") or {})
        except Exception as e:  # the endpoint may be gone at the end of a run
            log.debug("status read failed: %s", e)
            status = {}
        s = Sample(self.now(), tuple(pod_view(p, self.t0_wall) for p in pods), status)
        self.samples.append(s)
        return s

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.sample_once)
            except Exception as e:
                self.errors += 1
                log.warning("sample failed: %s", e)
            await asyncio.sleep(self.interval_s)

    def start(self, t0_wall: float | None = None) -> None:
        if t0_wall is not None:
            self.t0_wall = t0_wall
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
