"""Create, delete and read one kind of namespaced custom object (the peers' KEDA ScaledObject and
AIBrix PodAutoscaler)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CustomObjects:
    group: str
    version: str
    plural: str

    def create(self, api: Any, namespace: str, body: dict) -> None:
        from kubernetes import client

        client.CustomObjectsApi(api).create_namespaced_custom_object(
            self.group, self.version, namespace, self.plural, body)

    def delete(self, api: Any, namespace: str, name: str) -> None:
        """Delete `name`; one already gone is fine."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            client.CustomObjectsApi(api).delete_namespaced_custom_object(
                self.group, self.version, namespace, self.plural, name)
        except ApiException as e:
            if e.status != 404:
                raise

    def read_status(self, api: Any, namespace: str, name: str) -> dict:
        """The object's status ({} before its controller wrote one)."""
        from kubernetes import client

        obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
            self.group, self.version, namespace, self.plural, name)
        return obj.get("status") or {}
