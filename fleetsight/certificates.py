"""A one-use CA and one certificate it signs, made with the openssl command line (every host has it; no
Python crypto dependency). Used where FleetSight must make its own TLS material: Kafka's and
Elasticsearch's on one machine (pipelines.kafka_security) and a node's exporter certificate
(exporters.node_web_files)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

# P-256 keys, no passphrase: read by servers that start unattended.
EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


class CertificateError(RuntimeError):
    """openssl refused: its own message, last lines."""


@dataclass(frozen=True)
class Signed:
    """What sign_certificate leaves in its folder (the CA's key too: delete it with the folder, or keep it
    to sign more)."""

    ca_key: Path
    ca_cert: Path
    key: Path
    cert: Path


def openssl(work: Path, *args: str) -> None:
    result = subprocess.run(["openssl", *args], cwd=work, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise CertificateError(f"openssl {args[0]} failed: {result.stderr.strip()[-500:]}")


def is_address(name: str) -> bool:
    return ":" in name or name.replace(".", "").isdigit()


def sign_certificate(
    work: Path,
    ca_name: str,
    common_name: str,
    hosts: tuple[str, ...],
    days: int,
    client_auth: bool = False,
) -> Signed:
    """In work (make it 0700, or set a 0077 umask: openssl writes the keys with the process's umask): a
    CA named ca_name and a certificate for common_name valid for hosts (DNS names and IP addresses),
    for servers, and with client_auth for clients too."""
    signed = Signed(work / "ca.key", work / "ca.crt", work / "server.key", work / "server.crt")
    openssl(
        work, "req", "-x509", *EC_KEY, "-days", str(days), "-keyout", str(signed.ca_key),
        "-out", str(signed.ca_cert), "-subj", f"/CN={ca_name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    request, extensions = work / "server.csr", work / "server.ext"
    openssl(
        work, "req", *EC_KEY, "-keyout", str(signed.key), "-out", str(request), "-subj", f"/CN={common_name}"
    )
    names = ",".join(f"IP:{host}" if is_address(host) else f"DNS:{host}" for host in hosts)
    usage = "serverAuth,clientAuth" if client_auth else "serverAuth"
    extensions.write_text(
        f"subjectAltName={names}\nextendedKeyUsage={usage}\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=CA:FALSE\n"
    )
    openssl(
        work, "x509", "-req", "-in", str(request), "-CA", str(signed.ca_cert), "-CAkey", str(signed.ca_key),
        "-CAcreateserial", "-out", str(signed.cert), "-days", str(days), "-extfile", str(extensions),
    )  # fmt: skip
    for leftover in (request, extensions, work / "ca.srl"):
        leftover.unlink(missing_ok=True)
    return signed
