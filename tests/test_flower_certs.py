"""The throwaway TLS certificates and SuperNode keys of a local Flower deployment."""

from __future__ import annotations

import ipaddress
import stat

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from securefed.errors import ConfigError
from securefed.flower.certs import make_local_certificates, make_node_key


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_server_certificate_verifies_against_the_ca_and_names_loopback(tmp_path):
    paths = make_local_certificates(tmp_path / "tls")
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(paths.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the signature or issuer is wrong
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    key = serialization.load_pem_private_key(paths.server_key.read_bytes(), None)
    assert key.public_key().public_numbers() == server.public_key().public_numbers()
    assert _mode(paths.server_key) == 0o600
    # The CA's private key is never written: only the three files exist.
    assert sorted(p.name for p in (tmp_path / "tls").iterdir()) == [
        "ca.crt",
        "server.key",
        "server.pem",
    ]


def test_certificates_differ_per_call_and_a_foreign_ca_does_not_verify(tmp_path):
    a = make_local_certificates(tmp_path / "a")
    b = make_local_certificates(tmp_path / "b")
    ca_b = x509.load_pem_x509_certificate(b.ca_cert.read_bytes())
    server_a = x509.load_pem_x509_certificate(a.server_cert.read_bytes())
    with pytest.raises(InvalidSignature):
        server_a.verify_directly_issued_by(ca_b)


def test_node_key_is_p384_openssh_and_private_key_is_0600(tmp_path):
    key = make_node_key(tmp_path / "keys", "node-0")
    private = serialization.load_ssh_private_key(key.private_key.read_bytes(), None)
    public = serialization.load_ssh_public_key(key.public_key.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert isinstance(private.curve, ec.SECP384R1)
    assert private.public_key().public_numbers() == public.public_numbers()  # type: ignore[union-attr]
    assert _mode(key.private_key) == 0o600


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden"])
def test_bad_node_key_names_are_refused(tmp_path, name):
    with pytest.raises(ConfigError, match="plain file name"):
        make_node_key(tmp_path, name)


def test_no_hosts_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="at least one"):
        make_local_certificates(tmp_path, hosts=())
