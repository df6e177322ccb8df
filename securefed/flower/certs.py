"""Throwaway TLS certificates and SuperNode keys for a local Flower deployment.

:func:`make_local_certificates` writes a fresh certificate authority and a server certificate
for ``127.0.0.1``/``localhost`` signed by it; :func:`make_node_key` writes a SuperNode's
authentication key pair in the format Flower 1.42 reads (OpenSSH encodings of a NIST P-384
key: ``flower-supernode --auth-supernode-private-key`` and ``flwr supernode register``).
Private keys are created with mode ``0600``. These are for one local run: a deployment across
machines uses certificates from the operator's own CA (docs/deployment.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from securefed.errors import ConfigError

VALID_DAYS = 2  # a local deployment's certificates outlive no run worth keeping


@dataclass(frozen=True, kw_only=True)
class LocalCertificates:
    """Paths of a local deployment's TLS files (PEM)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True, kw_only=True)
class NodeKey:
    """Paths of one SuperNode's authentication key pair (OpenSSH encodings)."""

    private_key: Path
    public_key: Path


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file readable by its owner only (mode 0600 from creation)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)  # whatever the umask


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "securefed local deployment"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def make_local_certificates(
    directory: str | Path, *, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
) -> LocalCertificates:
    """Write a throwaway CA and a server certificate for ``hosts`` into ``directory``.

    The CA's private key is never written: nothing else can be signed by it after this call.
    The server certificate carries every host as a subject alternative name (IP addresses as
    IP entries, names as DNS entries), as gRPC's hostname check requires.

    Raises:
        ConfigError: ``hosts`` is empty.
    """
    if not hosts:
        raise ConfigError("hosts must name at least one address, got ()")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=VALID_DAYS)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = _name("securefed local CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA384())
    )

    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA384())
    )

    paths = LocalCertificates(
        ca_cert=out / "ca.crt", server_cert=out / "server.pem", server_key=out / "server.key"
    )
    paths.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        paths.server_key,
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    return paths


def make_node_key(directory: str | Path, name: str) -> NodeKey:
    """Write a SuperNode's P-384 key pair as ``NAME`` (private, 0600) and ``NAME.pub``.

    Flower 1.42 reads the private key with ``load_ssh_private_key`` (``flower-supernode
    --auth-supernode-private-key``) and the public key with ``load_ssh_public_key``
    (``flwr supernode register``), so both are OpenSSH encodings.

    Raises:
        ConfigError: ``name`` is empty or not a plain file name.
    """
    if not name or Path(name).name != name or name.startswith("."):
        raise ConfigError(f"node key name must be a plain file name, got {name!r}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    paths = NodeKey(private_key=out / name, public_key=out / f"{name}.pub")
    _write_private(
        paths.private_key,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
    )
    paths.public_key.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        + b"\n"
    )
    return paths


__all__ = ["LocalCertificates", "NodeKey", "make_local_certificates", "make_node_key"]
