"""The reconcile handler's errors: the API server failing or not reached at all is retried in seconds
(a Kopf TemporaryError), never left to Kopf's 60 s default for unexpected errors."""

from __future__ import annotations

import asyncio
import logging

import kopf
import pytest
from kubernetes.client.exceptions import ApiException
from preheat.controller import handlers, metrics
from urllib3.exceptions import MaxRetryError, ProtocolError

BODY = {
    "apiVersion": "preheat.dev/v1alpha1", "kind": "InferenceEndpoint",
    "metadata": {"name": "chat", "namespace": "team", "uid": "1234"},
    "spec": {"model": {"builtin": "tiny"}, "server": {"maxNumSeqs": 4, "maxQueue": 16}},
}


def _errors() -> float:
    return metrics.REGISTRY.get_sample_value("preheat_reconcile_total", {"outcome": "error"}) or 0.0


@pytest.mark.parametrize("failure", [
    MaxRetryError(None, "/apis/apps/v1/namespaces/team/deployments", reason="Connection refused"),
    ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer")),
    ApiException(status=503, reason="Service Unavailable"),
], ids=["unreachable", "reset", "api-503"])
def test_a_failed_reconcile_is_retried_in_seconds_and_counted(monkeypatch, failure: Exception) -> None:
    def fail(*_a, **_k):
        raise failure

    monkeypatch.setattr(handlers, "reconcile_objects", fail)
    before = _errors()
    with pytest.raises(kopf.TemporaryError) as err:
        asyncio.run(handlers.reconcile(body=BODY, logger=logging.getLogger("test"), memo=kopf.Memo()))
    assert err.value.delay == 5
    assert _errors() == before + 1


def test_a_bug_in_reconcile_is_not_mistaken_for_a_connection_failure(monkeypatch) -> None:
    def bug(*_a, **_k):
        raise KeyError("spec")

    monkeypatch.setattr(handlers, "reconcile_objects", bug)
    with pytest.raises(KeyError):
        asyncio.run(handlers.reconcile(body=BODY, logger=logging.getLogger("test"), memo=kopf.Memo()))
