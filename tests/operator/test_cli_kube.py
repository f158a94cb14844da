"""Operator plumbing without a cluster: CLI flags, in-cluster credentials, 409 retries, JSON logs."""

from __future__ import annotations

import json
import logging

import pytest
from kubernetes.client.exceptions import ApiException
from preheat.controller import kube
from preheat.controller.cli import JsonFormatter, parse_args
from preheat.controller.scale import retry_conflict


def test_cli_flags():
    args = parse_args(["-n", "a", "-n", "b", "--peering", "preheat", "--priority", "2", "--reactive-only",
                       "--interval", "3"])
    assert args.namespace == ["a", "b"] and args.peering == "preheat" and args.priority == 2
    assert args.reactive_only and args.interval == 3.0
    with pytest.raises(SystemExit):
        parse_args(["-n", "a", "--all-namespaces"])


def test_in_cluster_credentials_from_the_service_account_dir(tmp_path, monkeypatch):
    (tmp_path / "token").write_text("tok\n")
    (tmp_path / "ca.crt").write_text("---")
    (tmp_path / "namespace").write_text("preheat-system")
    monkeypatch.setattr(kube, "STANDARD_SA_DIR", str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    creds = kube.in_cluster()
    assert creds is not None
    assert creds.server == "https://127.0.0.1:6443" and creds.token == "tok"
    assert creds.ca_path == str(tmp_path / "ca.crt") and creds.namespace == "preheat-system"


def test_no_in_cluster_credentials_without_service_host(tmp_path, monkeypatch):
    (tmp_path / "token").write_text("tok")
    monkeypatch.setattr(kube, "STANDARD_SA_DIR", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert kube.in_cluster() is None


def test_conflicts_are_retried_other_errors_are_not():
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] < 3:
            raise ApiException(status=409, reason="Conflict")
        return "done"

    assert retry_conflict(flaky) == "done" and calls["n"] == 3

    def forbidden():
        raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ApiException):
        retry_conflict(forbidden)


def test_json_logs_carry_the_object():
    record = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, "promoted %s", ("pod-a",), None)
    record.k8s_ref = {"namespace": "team", "name": "chat"}
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "promoted pod-a" and line["namespace"] == "team" and line["object"] == "chat"
