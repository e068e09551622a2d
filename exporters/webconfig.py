"""The exporters' web configuration, in exporter-toolkit's file format (what node_exporter and
dcgm-exporter read with ``--web.config.file``): TLS for the endpoint, and basic auth with bcrypt hashes.

    tls_server_config:
      cert_file: /etc/fleetsight/tls/node.crt
      key_file: /etc/fleetsight/tls/node.key
      client_ca_file: /etc/fleetsight/tls/ca.crt     # optional: with client_auth_type, scrapers need a cert
      client_auth_type: RequireAndVerifyClientCert    # or NoClientCert (default)
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':')

``promtool check web-config FILE`` checks the same file. A mistake (unknown key, missing file, a
password instead of a hash) stops the exporter at start with the file and the key named.
"""

from __future__ import annotations

import base64
import binascii
import grp
import os
import secrets
import ssl
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import yaml

TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version"}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


class WebConfigError(ValueError):
    """The web configuration file is wrong; the message names the file and the key."""


@dataclass
class WebConfig:
    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    # bcrypt is slow on purpose (~50 ms): a scraper's credentials, once checked, are remembered
    _verified: set[tuple[str, str]] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def authorized(self, header: str | None) -> bool:
        """Whether an Authorization header passes basic auth (always, when no users are configured)."""
        if not self.users:
            return True
        scheme, _, encoded = (header or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        key = (user, password)
        with self._lock:
            if key in self._verified:
                return True
        import bcrypt  # only basic auth needs it; load() checked it is there

        if not bcrypt.checkpw(password.encode(), hashed):
            return False
        with self._lock:
            self._verified.add(key)
        return True


def load(path: str | Path) -> WebConfig:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise WebConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise WebConfigError(f"{path}: expected a mapping")
    unknown = set(raw) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise WebConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    config = WebConfig()
    if raw.get("tls_server_config"):
        config.tls = _tls(path, raw["tls_server_config"])
    for user, hashed in (raw.get("basic_auth_users") or {}).items():
        if not str(hashed).startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"{path}: basic_auth_users.{user}: expected a bcrypt hash, not a password")
        config.users[str(user)] = str(hashed).encode()
    if config.users:
        _require_bcrypt(path)
    return config


def _require_bcrypt(path: Path) -> None:
    """Basic auth checks bcrypt hashes; an agent without basic auth runs without the bcrypt module."""
    try:
        import bcrypt  # noqa: F401
    except ImportError:
        message = f"{path}: basic_auth_users needs the bcrypt module: pip install bcrypt"
        raise WebConfigError(message) from None


def _tls(path: Path, section: dict) -> ssl.SSLContext:
    unknown = set(section) - TLS_KEYS
    if unknown:
        raise WebConfigError(f"{path}: tls_server_config: unknown key(s) {', '.join(sorted(unknown))}")
    for key in ("cert_file", "key_file"):
        if not section.get(key):
            raise WebConfigError(f"{path}: tls_server_config.{key} is required")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS.get(
        str(section.get("min_version", "TLS12")), ssl.TLSVersion.TLSv1_2
    )
    try:
        context.load_cert_chain(section["cert_file"], section["key_file"])
        auth = section.get("client_auth_type", "NoClientCert")
        if auth not in CLIENT_AUTH:
            raise WebConfigError(
                f"{path}: tls_server_config.client_auth_type: one of {', '.join(CLIENT_AUTH)}"
            )
        context.verify_mode = CLIENT_AUTH[auth]
        if section.get("client_ca_file"):
            context.load_verify_locations(section["client_ca_file"])
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"{path}: tls_server_config: {exc}") from None
    return context


# -- a node's own web configuration, made at install (the fleetsight-node package) --------------------

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
        raise WebConfigError(f"no group {group!r} (the fleetsight-python package creates it)") from None


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
        _sign_node_certificate(work, names)
        _place(work / "node.key", files.key, 0o640, gid)
        _place(work / "node.crt", files.cert, 0o644, None)
        _place(work / "ca.crt", files.ca, 0o644, None)
    return [files.key, files.cert, files.ca]


def _sign_node_certificate(work: Path, names: tuple[str, ...]) -> None:
    """ca.crt, and node.crt + node.key for names (DNS names and IP addresses), in work (a 0700 folder:
    openssl's keys are never readable by others). The CA's key stays there, to be deleted with it."""
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    days = ("-days", str(NODE_CERT_DAYS))
    _openssl(
        work, "req", "-x509", *curve, *days, "-keyout", "ca.key", "-out", "ca.crt",
        "-subj", f"/CN={SERVER_NAME} node CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign",
    )  # fmt: skip
    _openssl(work, "req", *curve, "-keyout", "node.key", "-out", "node.csr", "-subj", f"/CN={SERVER_NAME}")
    alt = ",".join(f"IP:{name}" if _is_address(name) else f"DNS:{name}" for name in names)
    (work / "node.ext").write_text(
        f"subjectAltName={alt}\nextendedKeyUsage=serverAuth\n"
        "keyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n"
    )
    _openssl(
        work, "x509", "-req", "-in", "node.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "node.crt", *days, "-extfile", "node.ext",
    )  # fmt: skip


def _is_address(name: str) -> bool:
    return ":" in name or name.replace(".", "").isdigit()


def _openssl(work: Path, *args: str) -> None:
    result = subprocess.run(["openssl", *args], cwd=work, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise WebConfigError(f"openssl {args[0]} failed: {result.stderr.strip()[-500:]}")


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
