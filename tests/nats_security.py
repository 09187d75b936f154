"""The tests' NATS runs as a team would run it: TLS with client certificates (a CA made here
with ``cryptography``), accounts, and for each stream a node user whose permissions are that
stream's subjects and the JetStream API calls a node makes, nothing else (no stream config
update or deletion: docs/security.md gives the list)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def node_permissions(stream: str) -> dict[str, dict[str, list[str]]]:
    """What a kbgraph node of ``stream`` may do on NATS."""
    api = "$JS.API"
    return {
        "publish": {
            "allow": [
                f"{stream}.*",  # deliveries (and, for the admin command, decisions)
                f"{api}.STREAM.INFO.{stream}",
                f"{api}.STREAM.CREATE.{stream}",  # the first node creates the stream
                f"{api}.STREAM.MSG.GET.{stream}",
                f"{api}.CONSUMER.CREATE.{stream}",
                f"{api}.CONSUMER.CREATE.{stream}.>",
                f"{api}.CONSUMER.DELETE.{stream}.*",
                f"$JS.FC.{stream}.>",  # flow control replies of its push consumer
                f"{api}.STREAM.PURGE.{stream}",  # trimming below the snapshots
                # the snapshots' object store, the live nodes' positions and the cluster's
                # embedder lease: these three alone, made, read, written and trimmed (never
                # updated or deleted)
                *[
                    f"{api}.{call}.{bucket}{tail}"
                    for bucket in (
                        f"OBJ_{stream}-snapshots",
                        f"KV_{stream}-nodes",
                        f"KV_{stream}-embedder",
                    )
                    for call, tail in (
                        ("STREAM.INFO", ""),
                        ("STREAM.CREATE", ""),
                        ("STREAM.PURGE", ""),
                        ("STREAM.MSG.GET", ""),
                        ("DIRECT.GET", ""),
                        ("DIRECT.GET", ".>"),
                        ("CONSUMER.CREATE", ""),
                        ("CONSUMER.CREATE", ".>"),
                        ("CONSUMER.DELETE", ".*"),
                    )
                ],
                f"{api}.STREAM.NAMES",  # nats-py finds the object store's stream by subject
                f"$O.{stream}-snapshots.>",
                f"$KV.{stream}-nodes.>",
                f"$KV.{stream}-embedder.>",
                f"$JS.FC.OBJ_{stream}-snapshots.>",
                f"$JS.FC.KV_{stream}-nodes.>",
                f"$JS.FC.KV_{stream}-embedder.>",
            ]
        },
        "subscribe": {"allow": ["_INBOX.>"]},  # replies and its consumer's deliveries
    }


def _usage(
    *, digital_signature: bool = False, key_cert_sign: bool = False, crl_sign: bool = False
) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


class Tls:
    """A CA, one certificate for the servers (client and route connections) and one client
    certificate that nodes and the tests' administrator present."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.ca = folder / "ca.pem"
        self.server_cert, self.server_key = folder / "server.pem", folder / "server-key.pem"
        self.client_cert, self.client_key = folder / "client.pem", folder / "client-key.pem"
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kbgraph test CA")])
        ca_id = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
        ca = (
            self._builder(ca_name, ca_name, ca_key, ca_id)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(key_cert_sign=True, crl_sign=True), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        self.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        for cert, key, name, usages in (
            (
                self.server_cert,
                self.server_key,
                "localhost",
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
            ),
            (self.client_cert, self.client_key, "kbgraph-node", [ExtendedKeyUsageOID.CLIENT_AUTH]),
        ):
            own = ec.generate_private_key(ec.SECP256R1())
            subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
            signed = (
                self._builder(subject, ca_name, own, ca_id)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(_usage(digital_signature=True), critical=True)
                .add_extension(
                    x509.SubjectAlternativeName(
                        [
                            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                            x509.DNSName("localhost"),
                        ]
                    ),
                    critical=False,
                )
                .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                .sign(ca_key, hashes.SHA256())
            )
            cert.write_bytes(signed.public_bytes(serialization.Encoding.PEM))
            key.write_bytes(
                own.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )

    @staticmethod
    def _builder(
        subject: x509.Name,
        issuer: x509.Name,
        key: ec.EllipticCurvePrivateKey,
        issuer_id: x509.SubjectKeyIdentifier,
    ) -> x509.CertificateBuilder:
        """A certificate as a CA makes one: its own key's identifier and its issuer's (a
        strict verifier, Python 3.13's default context, refuses a leaf without the latter)."""
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(issuer_id), False
            )
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
        )

    def block(self) -> str:
        """A nats-server ``tls { }`` block: this cert, and client certificates required."""
        return (
            f"tls {{ cert_file: {json.dumps(str(self.server_cert))},"
            f" key_file: {json.dumps(str(self.server_key))},"
            f" ca_file: {json.dumps(str(self.ca))}, verify: true, timeout: 5 }}"
        )


class Accounts:
    """The account the streams live in: an administrator (the tests' own reads and faults),
    one user per stream for its nodes, and the system account."""

    def __init__(self, folder: Path, streams: list[str]) -> None:
        self.streams = streams
        self.admin_password = secrets.token_urlsafe(18)
        self.node_password = secrets.token_urlsafe(18)
        self.node_password_file = folder / "node.password"
        self.node_password_file.write_text(self.node_password + "\n")
        self.mac_secret_file = folder / "cluster.mac"
        self.mac_secret_file.write_text(secrets.token_urlsafe(32) + "\n")

    @staticmethod
    def node_user(stream: str) -> str:
        return f"node-{stream}"

    def block(self) -> str:
        users: list[dict[str, object]] = [{"user": "admin", "password": self.admin_password}]
        users += [
            {
                "user": self.node_user(stream),
                "password": self.node_password,
                "permissions": node_permissions(stream),
            }
            for stream in self.streams
        ]
        system = [{"user": "sys", "password": secrets.token_urlsafe(18)}]
        return (
            f"accounts {{ KBGRAPH: {{ jetstream: enabled, users: {json.dumps(users)} }},"
            f" SYS: {{ users: {json.dumps(system)} }} }}\nsystem_account: SYS\n"
        )
