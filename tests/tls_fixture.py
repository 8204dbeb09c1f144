"""Throwaway certificate authorities and serving certificates for the webhook's HTTPS tests.

``Ca("one").issue("127.0.0.1", "localhost")`` -> (cert PEM, key PEM).
``SecretDir(path)`` lays out tls.crt/tls.key the way the kubelet mounts a
Secret (``..data`` -> a timestamped directory, the files symlinked through
it) and ``rotate()`` swaps ``..data`` atomically, as the kubelet does when
cert-manager renews the certificate.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import itertools
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_serial = itertools.count(1)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Ca:
    def __init__(self, cn: str):
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        self.cert = (
            x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(self.key.public_key()).serial_number(next(_serial))
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def write(self, path: Path) -> Path:
        path.write_bytes(self.pem)
        return path

    def issue(self, *hosts: str, client: bool = False) -> tuple[bytes, bytes]:
        """A serving certificate for ``hosts`` (``client=True``: a client certificate, CN hosts[0])."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        sans = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        cert = (
            x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(self.cert.subject)
            .public_key(key.public_key()).serial_number(next(_serial))
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH if client
                                                  else x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


class SecretDir:
    """A Secret volume as the kubelet lays it out: tls.crt -> ..data/tls.crt, ..data -> ..<version>."""

    def __init__(self, path: Path, cert: bytes, key: bytes):
        self.path = path
        self.versions = itertools.count(1)
        path.mkdir(parents=True)
        self.rotate(cert, key)
        for name in ("tls.crt", "tls.key"):
            (path / name).symlink_to(Path("..data") / name)

    def rotate(self, cert: bytes, key: bytes) -> None:
        version = self.path / f"..2024_01_01_00_00_{next(self.versions):02d}.0000"
        version.mkdir()
        (version / "tls.crt").write_bytes(cert)
        (version / "tls.key").write_bytes(key)
        tmp = self.path / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, self.path / "..data")  # one rename: a reader sees the old pair or the new
