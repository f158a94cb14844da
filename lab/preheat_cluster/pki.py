"""The local cluster's PKI: one CA, serving certs for etcd and the API server, client certs, and the
service-account signing key. Generated with `cryptography` (no openssl CLI needed), once per state dir."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Long enough for any test run or demo; the state dir is thrown away by `down`.
_VALIDITY = dt.timedelta(days=30)


@dataclass(frozen=True)
class Pki:
    """Paths of every PEM file the components need."""

    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    def crt(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"


def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _issue(
    ca_key, ca_name: x509.Name, subject: x509.Name, key, *, server: bool, client: bool,
    dns: list[str] = (), ips: list[str] = (),
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if dns or ips:
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return b.sign(ca_key, hashes.SHA256())


def _ec_key():
    # P-256 keys are fast to generate on a loaded 2-core box (RSA-2048 takes ~100 ms each).
    return ec.generate_private_key(ec.SECP256R1())


# name -> (CN, O, server, client): every identity the launcher hands out.
_CERTS = {
    "etcd": ("etcd", None, True, True),
    "apiserver": ("kube-apiserver", None, True, False),
    # The controller-manager's and scheduler's own HTTPS endpoints (/healthz, /metrics).
    "components-serving": ("localhost", None, True, False),
    "apiserver-etcd-client": ("kube-apiserver-etcd-client", None, False, True),
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters", False, True),
    # The admin identity is used by kubectl, the controller-manager, the scheduler, CoreDNS and
    # Prometheus' service discovery (everything that runs on the host, not in a pod).
    "admin": ("preheat-admin", "system:masters", False, True),
    "controller-manager": ("system:kube-controller-manager", None, False, True),
    "scheduler": ("system:kube-scheduler", None, False, True),
}


# 10.250.0.254: the API server's address for pods on real nodes (realnode.API_SERVER_IP); 10.96.0.1:
# the `kubernetes` Service.
SERVER_IPS = ["127.0.0.1", "10.96.0.1", "10.250.0.254"]


def issue_cert(pki: Pki, name: str, *, cn: str, org: str | None, server: bool, client: bool,
               dns: list[str] = (), ips: list[str] = ()) -> tuple[Path, Path]:
    """One more certificate from the state dir's CA (a kubelet's, kube-proxy's); idempotent by name."""
    if pki.crt(name).exists() and pki.key(name).exists():
        return pki.crt(name), pki.key(name)
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    ca_name = x509.load_pem_x509_certificate(pki.ca_crt.read_bytes()).subject
    key = _ec_key()
    cert = _issue(ca_key, ca_name, _name(cn, org), key, server=server, client=client, dns=list(dns), ips=list(ips))
    _write_key(pki.key(name), key)
    pki.crt(name).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pki.crt(name), pki.key(name)


def ensure_front_proxy(pki: Pki) -> tuple[Path, Path, Path]:
    """The aggregation layer's front-proxy CA and the API server's proxy client cert (CN
    front-proxy-client) signed by it; returns (CA cert, client cert, client key). A CA of its own, as
    the Kubernetes docs ask (configure-aggregation-layer): an extension API server trusts the identity
    headers of any client whose cert this CA signed, so it must sign nothing else. Idempotent."""
    ca_crt, ca_key_path = pki.dir / "front-proxy-ca.crt", pki.dir / "front-proxy-ca.key"
    if not (ca_crt.exists() and ca_key_path.exists() and pki.crt("front-proxy-client").exists()):
        ca_key, ca = _new_ca("preheat-front-proxy-ca")
        _write_key(ca_key_path, ca_key)
        ca_crt.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        key = _ec_key()
        cert = _issue(ca_key, ca.subject, _name("front-proxy-client"), key, server=False, client=True)
        _write_key(pki.key("front-proxy-client"), key)
        pki.crt("front-proxy-client").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return ca_crt, pki.crt("front-proxy-client"), pki.key("front-proxy-client")


def _new_ca(cn: str):
    """A self-signed CA: (private key, certificate)."""
    ca_key = _ec_key()
    ca_name = _name(cn)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return ca_key, ca


def ensure_pki(directory: Path) -> Pki:
    """Create the PKI in `directory` unless it is already there (idempotent)."""
    pki = Pki(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if pki.ca_crt.exists() and all(pki.crt(n).exists() for n in _CERTS) and pki.sa_pub.exists():
        return pki
    ca_key, ca = _new_ca("preheat-local-ca")
    ca_name = ca.subject
    _write_key(pki.ca_key, ca_key)
    pki.ca_crt.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                  "kubernetes.default.svc.cluster.local", "etcd"]
    for name, (cn, org, server, client) in _CERTS.items():
        key = _ec_key()
        cert = _issue(ca_key, ca_name, _name(cn, org), key, server=server, client=client,
                      dns=server_dns if server else [], ips=SERVER_IPS if server else [])
        _write_key(pki.key(name), key)
        pki.crt(name).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    # The service-account signer must be RSA: the API server's key loader accepts RSA and ECDSA, but
    # RSA is what every client library expects to verify.
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.sa_key, sa)
    pki.sa_pub.write_bytes(
        sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki
