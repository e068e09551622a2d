"""The node agent's own web configuration, made at install by the fleetsight-node package
(``fleetsight exporter make-web-config``, called by its postinst): a certificate from a one-use CA, a
random scrape password and its bcrypt hash, in exporter-toolkit's format (:mod:`fleetsight.webconfig`
reads it). Files already there (the fleet's certificate, its shared password) are used, never overwritten.
"""

from __future__ import annotations

import grp
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fleetsight.certificates import CertificateError, sign_certificate
from fleetsight.webconfig import WebConfigError, load

SERVER_NAME = "fleetsight-exporter"
"""The name the agent's certificate is issued for and Prometheus checks (tls_config server_name in
metrics/prometheus.yml) whatever address it dials; the fleet's shared certificate carries it too."""
SCRAPE_USER = "prometheus"
NODE_CERT_DAYS = 3650  # nobody renews a node-local certificate by hand: it is replaced, or remade


@dataclass(frozen=True)
class NodeFiles:
    """The node agent's web configuration and the files it names, under root (``/`` when installed)."""

    root: Path

    @property
    def etc(self) -> Path:
        return self.root / "etc" / "fleetsight"

    @property
    def config(self) -> Path:
        return self.etc / "exporter-web.yml"

    @property
    def cert(self) -> Path:
        return self.etc / "exporter-tls.crt"

    @property
    def key(self) -> Path:
        return self.etc / "exporter-tls.key"

    @property
    def ca(self) -> Path:
        return self.etc / "exporter-ca.crt"

    @property
    def password(self) -> Path:
        return self.etc / "exporter-scrape-password"

    @property
    def record(self) -> Path:
        """The files this program made (as installed, one a line): a purge removes those and no others."""
        return self.root / "var" / "lib" / "fleetsight" / "exporter-web.generated"


def make_node_config(root: Path, group: str | None = None, hosts: tuple[str, ...] = ()) -> list[Path]:
    """The node agent's web configuration: TLS with a node certificate, basic auth for ``prometheus``.
    Only what is missing is made, nothing is ever overwritten: with the configuration there, nothing at
    all; otherwise a certificate with its key and CA, or a password, already put there (the fleet's
    certificate, its shared scrape password) is used as it is. Returns the files written.

    Run as root, the key, password and configuration are root:group 0640 (group: the agent's). The
    certificate is signed by a CA made for it alone, whose key is destroyed at once: the CA file can
    vouch for this one certificate and nothing else."""
    files = NodeFiles(Path(root))
    if files.config.exists():
        return []
    gid = _group_id(group)
    files.etc.mkdir(parents=True, exist_ok=True)
    names = tuple(dict.fromkeys((SERVER_NAME, *hosts, "localhost", "127.0.0.1", "::1")))
    written = _node_certificate(files, gid, names)
    if files.password.exists():
        password = files.password.read_text().strip()
        if not password:
            raise WebConfigError(f"{files.password}: empty")
    else:
        password = secrets.token_urlsafe(24)
        _place_secret(files.password, password + "\n", gid)
        written.append(files.password)
    _place_secret(files.config, node_config_text(files, password), gid, check=True)
    written.append(files.config)
    files.record.parent.mkdir(parents=True, exist_ok=True)
    with files.record.open("a") as record:
        record.writelines(f"/{path.relative_to(files.root)}\n" for path in written)
    return written


def node_config_text(files: NodeFiles, password: str) -> str:
    import bcrypt

    digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
    return (
        "# The node agent's web configuration (--web.config.file in node.env), made at install by\n"
        "# /usr/lib/fleetsight/make-exporter-web-config. Not a conffile: replace it, and the files it\n"
        "# names, with the fleet's (docs/deployment.md); check with `promtool check web-config FILE`.\n"
        f"tls_server_config:\n  cert_file: {files.cert}\n  key_file: {files.key}\n"
        f"basic_auth_users:\n  {SCRAPE_USER}: {digest}\n"
    )


def _group_id(group: str | None) -> int | None:
    """The group that reads the secrets, when this runs as root (anyone else cannot give files away)."""
    if group is None or os.geteuid() != 0:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        made_by = "the fleetsight-python-node or fleetsight-python package creates it"
        raise WebConfigError(f"no group {group!r} ({made_by})") from None


def _node_certificate(files: NodeFiles, gid: int | None, names: tuple[str, ...]) -> list[Path]:
    """Certificate, key and CA: made when none is there, kept when certificate and key are (the CA then
    only matters to the local healthcheck); half a set is an error, as which one was meant is a guess."""
    there = {path for path in (files.cert, files.key, files.ca) if path.exists()}
    if {files.cert, files.key} <= there:
        return []
    if there:
        missing = sorted(map(str, {files.cert, files.key} - there))
        raise WebConfigError(
            f"{', '.join(sorted(map(str, there)))} there without {', '.join(missing)}: put the "
            "certificate and its key (and the CA that signed it) in place, or none of them"
        )
    with tempfile.TemporaryDirectory(dir=files.etc, prefix=".exporter-tls-") as scratch:
        work = Path(scratch)
        # A one-use CA: its key goes with the scratch folder (work is 0700: the keys are never readable).
        try:
            signed = sign_certificate(work, f"{SERVER_NAME} node CA", SERVER_NAME, names, NODE_CERT_DAYS)
        except CertificateError as error:
            raise WebConfigError(str(error)) from None
        _place(signed.key, files.key, 0o640, gid)
        _place(signed.cert, files.cert, 0o644, None)
        _place(signed.ca_cert, files.ca, 0o644, None)
    return [files.key, files.cert, files.ca]


def _place(source: Path, target: Path, mode: int, gid: int | None) -> None:
    """Move source to target, which must not exist (a hard link fails where a rename would replace)."""
    source.chmod(mode)
    if gid is not None:
        os.chown(source, 0, gid)
    try:
        os.link(source, target)
    except FileExistsError:
        raise WebConfigError(f"{target}: appeared while this ran; left as it is") from None
    source.unlink()


def _place_secret(target: Path, text: str, gid: int | None, check: bool = False) -> None:
    """Write text to target, 0600 from the first byte; with check, load it as a web configuration first."""
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".exporter-web-") as scratch:
        staged = Path(scratch) / target.name
        descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(text)
        if check:
            load(staged)
        _place(staged, target, 0o640, gid)
