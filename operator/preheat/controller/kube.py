"""Kubernetes client configuration: a kubeconfig, or in-cluster credentials.

In-cluster means the kubelet's projected service-account token (/var/run/secrets/kubernetes.io/
serviceaccount) with KUBERNETES_SERVICE_HOST/PORT. The same settings feed the kubernetes client and
Kopf's login, so both talk to the same API server with the same identity.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client, config

STANDARD_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class Credentials:
    server: str
    ca_path: str | None
    token: str | None
    cert_path: str | None
    key_path: str | None
    insecure: bool
    namespace: str | None
    source: str


def _serviceaccount_dir() -> Path | None:
    sa = Path(STANDARD_SA_DIR)
    return sa if (sa / "token").is_file() else None


def in_cluster() -> Credentials | None:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    sa = _serviceaccount_dir()
    if not (host and port and sa):
        return None
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    ca = sa / "ca.crt"
    ns = sa / "namespace"
    return Credentials(
        server=f"https://{host}:{port}",
        ca_path=str(ca) if ca.is_file() else None,
        token=(sa / "token").read_text().strip(),
        cert_path=None,
        key_path=None,
        insecure=not ca.is_file(),
        namespace=ns.read_text().strip() if ns.is_file() else None,
        source=f"serviceaccount {sa}",
    )


def configure(kubeconfig: str | None = None) -> Credentials:
    """Set the kubernetes client's default configuration and return what was used.

    Order: an explicit --kubeconfig, then $KUBECONFIG, then in-cluster credentials, then ~/.kube/config.
    """
    path = kubeconfig or os.environ.get("KUBECONFIG")
    creds = None if path else in_cluster()
    cfg = client.Configuration()
    if creds is not None:
        cfg.host = creds.server
        cfg.api_key = {"authorization": creds.token or ""}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        cfg.ssl_ca_cert = creds.ca_path
        cfg.verify_ssl = not creds.insecure
    else:
        config.load_kube_config(config_file=path, client_configuration=cfg)
        token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        if token and token.lower().startswith("bearer "):
            token = token[7:]
        creds = Credentials(
            server=cfg.host,
            ca_path=cfg.ssl_ca_cert,
            token=token,
            cert_path=cfg.cert_file,
            key_path=cfg.key_file,
            insecure=not cfg.verify_ssl,
            namespace=None,
            source=f"kubeconfig {path or '~/.kube/config'}",
        )
    # Many concurrent loops share one client: a bigger pool avoids urllib3 "pool is full" churn.
    cfg.connection_pool_maxsize = 32
    client.Configuration.set_default(cfg)
    return creds


_SHARED: client.ApiClient | None = None


def shared_api() -> client.ApiClient:
    """One ApiClient (one urllib3 pool, kept-alive TLS connections) for every worker thread.

    A fresh ApiClient per call would open a new TLS connection each time: with 200 endpoints
    stepping every 15 s that is most of the operator's CPU.
    """
    global _SHARED
    if _SHARED is None:
        _SHARED = client.ApiClient()
    return _SHARED
