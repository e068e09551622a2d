"""OpenSearch's security plugin configured from the Elasticsearch model of ``security/elasticsearch.yml``:
the same users, the same least-privilege roles, TLS on HTTP and transport, basic auth against the
plugin's internal user database. docs/security.md T2, T3, T5.

The local stack's OpenSearch runs *without* the plugin (every local client would then need a credential);
this module serves the secured variant that ``fleetsight setup`` builds beside it
(:func:`pipelines.opensearch_install.install_opensearch_security`) and that ``tests/pipelines/
test_opensearch_security.py`` starts, so that the role model of production is enforced by a real server
here, not only read statically.

How Elasticsearch's privileges map (:data:`CLUSTER_PRIVILEGES`, :data:`INDEX_PRIVILEGES`): onto the
plugin's static action groups where one has the same meaning (``read`` -> ``read``, ``index`` ->
``index``, ``create_index`` -> ``create_index``, ``delete`` -> ``delete``, ``manage`` -> ``manage``,
``monitor`` -> ``cluster_monitor``, ``manage_pipeline`` -> ``cluster_manage_pipelines``,
``manage_index_templates`` -> ``cluster_manage_index_templates``), else onto the transport actions
themselves (``view_index_metadata``: get index, mappings, aliases, settings, field caps, resolve).
OpenSearch checks the multi-document APIs at cluster level where Elasticsearch grants them with the index
privilege, so ``index`` also grants the cluster action ``indices:data/write/bulk`` and ``read`` grants
``cluster_composite_ops_ro`` (mget, msearch, scroll); each still needs the index privilege on every
index it touches.

What has no exact equivalent, said here rather than papered over:

- ``manage_ilm``: OpenSearch has no ILM; its Index State Management plugin's cluster actions
  (``cluster:admin/opendistro/ism/*``) are granted instead. The plugin is not part of the local
  OpenSearch, so `logs apply` reports the policies as skipped there.
- Kibana application privileges (``applications``): OpenSearch Dashboards has tenants instead; a role
  with only ``*.read`` Kibana features gets ``kibana_all_read`` on the global tenant, one with any
  ``*.all`` feature ``kibana_all_write``. The feature-level split (Discover vs. dashboards vs. saved
  objects management) does not exist in OpenSearch Dashboards.
- ``kibana_system`` (Elasticsearch's built-in Kibana server user) becomes the plugin's ``kibanaserver``
  user mapped to its static ``kibana_server`` role, with the same password secret.
- The ``elastic`` superuser: none. The plugin loads this configuration from files on the first start
  (``plugins.security.allow_default_init_securityindex``); changing it later is ``securityadmin.sh``'s
  job with an admin certificate, which is not issued here, so nobody can rewrite the roles over HTTP.
- Audit logging (Elasticsearch's ``xpack.security.audit``) is left off, as in docker-compose.yml.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from .es_security import SECURITY_FILE, SecurityError, load, read_secret
from .kafka_security import make_certificates, write_private
from .opensearch_install import chown_tree, opensearch_run_as

NODE_CN = "fleetsight-opensearch"
"""The subject of the node's certificate (``CN=...``): the plugin admits a transport peer by it
(``plugins.security.nodes_dn``)."""
SECURITY_DIR = "opensearch-security"
"""The plugin's configuration folder, under the node's config folder."""
KIBANA_SERVER_USER = "kibanaserver"

CLUSTER_PRIVILEGES: dict[str, list[str]] = {
    "monitor": ["cluster_monitor"],
    "manage_pipeline": ["cluster_manage_pipelines"],
    "manage_index_templates": ["cluster_manage_index_templates"],
    "manage_ilm": ["cluster:admin/opendistro/ism/*"],
}
INDEX_PRIVILEGES: dict[str, list[str]] = {
    "read": ["read"],
    "view_index_metadata": [
        "indices:admin/get",
        "indices:admin/mappings/get",
        "indices:admin/mappings/fields/get*",
        "indices:admin/aliases/get",
        "indices:admin/resolve/index",
        "indices:admin/validate/query",
        "indices:monitor/settings/get",
        "indices:data/read/field_caps*",
        "indices:admin/shards/search_shards",
    ],
    "create_index": ["create_index"],
    "index": ["index"],
    "delete": ["delete"],
    "manage": ["manage"],
}
# The cluster-level actions OpenSearch wants for what an Elasticsearch index privilege covers.
IMPLIED_CLUSTER: dict[str, list[str]] = {
    "index": ["indices:data/write/bulk"],
    "read": ["cluster_composite_ops_ro"],
}


def meta(kind: str) -> dict[str, Any]:
    return {"_meta": {"type": kind, "config_version": 2}}


def translated(table: dict[str, list[str]], privilege: str, role: str) -> list[str]:
    if privilege not in table:
        raise SecurityError(f"role {role}: no OpenSearch equivalent known for the privilege {privilege!r}")
    return table[privilege]


def unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def tenant_permissions(applications: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    """Kibana application privileges as OpenSearch Dashboards tenant permissions (global tenant)."""
    privileges = [p for app in applications for p in app.get("privileges", [])]
    if not privileges:
        return []
    if any(not p.startswith("feature_") for p in privileges):
        raise SecurityError(f"role {role}: only Kibana feature privileges translate to tenants")
    action = "kibana_all_write" if any(p.endswith(".all") for p in privileges) else "kibana_all_read"
    return [{"tenant_patterns": ["global_tenant"], "allowed_actions": [action]}]


def translate_role(name: str, role: dict[str, Any]) -> dict[str, Any]:
    cluster = [a for p in role.get("cluster", []) for a in translated(CLUSTER_PRIVILEGES, p, name)]
    index_permissions = []
    for grant in role.get("indices", []):
        privileges = grant["privileges"]
        actions = [a for p in privileges for a in translated(INDEX_PRIVILEGES, p, name)]
        cluster += [a for p in privileges for a in IMPLIED_CLUSTER.get(p, [])]
        index_permissions.append({"index_patterns": list(grant["names"]), "allowed_actions": unique(actions)})
    return {
        "reserved": False,
        "description": f"FleetSight: {name} (translated from security/elasticsearch.yml)",
        "cluster_permissions": unique(cluster),
        "index_permissions": index_permissions,
        "tenant_permissions": tenant_permissions(role.get("applications", []), name),
    }


def roles(document: dict[str, Any]) -> dict[str, Any]:
    return {**meta("roles"), **{name: translate_role(name, role) for name, role in document["roles"].items()}}


def roles_mapping(document: dict[str, Any]) -> dict[str, Any]:
    mapping: dict[str, Any] = meta("rolesmapping")
    for user, entry in document["users"].items():
        for role in entry["roles"]:
            mapping.setdefault(role, {"reserved": False, "users": []})["users"].append(user)
    if "kibana_system" in document.get("builtin_passwords", {}):
        mapping["kibana_server"] = {"reserved": True, "users": [KIBANA_SERVER_USER]}
    return mapping


def bcrypt_hash(password: str) -> str:
    """The hash the plugin stores; ``$2y$`` as its own hash tool writes it (the same algorithm as
    Python bcrypt's ``$2b$``)."""
    import bcrypt

    digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=12)).decode()
    return "$2y$" + digest.removeprefix("$2b$")


def internal_users(document: dict[str, Any], secrets_dir: Path) -> dict[str, Any]:
    """Every user with the bcrypt hash of its password secret (secrets_dir/<password_secret>)."""
    users: dict[str, Any] = meta("internalusers")
    for name, entry in document["users"].items():
        password = read_secret(secrets_dir / entry["password_secret"], f"the password secret of user {name}")
        users[name] = {"hash": bcrypt_hash(password), "reserved": False, "description": f"FleetSight {name}"}
    secret = document.get("builtin_passwords", {}).get("kibana_system")
    if secret:
        password = read_secret(secrets_dir / secret, "the password secret of built-in user kibana_system")
        users[KIBANA_SERVER_USER] = {"hash": bcrypt_hash(password), "reserved": True}
    return users


def auth_config() -> dict[str, Any]:
    """HTTP basic auth against the internal users, nothing anonymous."""
    basic = {
        "description": "HTTP basic auth against the internal users (internal_users.yml)",
        "http_enabled": True,
        "transport_enabled": True,
        "order": 0,
        "http_authenticator": {"type": "basic", "challenge": True},
        "authentication_backend": {"type": "intern"},
    }
    dynamic = {"http": {"anonymous_auth_enabled": False}, "authc": {"basic_internal_auth_domain": basic}}
    return {**meta("config"), "config": {"dynamic": dynamic}}


def security_files(secrets_dir: Path, document: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The plugin's configuration files (name -> content) for the model (default: security/
    elasticsearch.yml), with the hashes of the passwords in secrets_dir."""
    document = document if document is not None else load(SECURITY_FILE)
    return {
        "config.yml": auth_config(),
        "internal_users.yml": internal_users(document, secrets_dir),
        "roles.yml": roles(document),
        "roles_mapping.yml": roles_mapping(document),
        # No demo content: the plugin's own examples (an admin_tenant, demo users) are replaced.
        "action_groups.yml": meta("actiongroups"),
        "tenants.yml": meta("tenants"),
        "nodes_dn.yml": meta("nodesdn"),
    }


def node_settings() -> list[str]:
    """opensearch.yml lines: TLS on transport and HTTP with the node's certificate (files in the config
    folder, where the plugin may read them), the node DN, and the configuration loaded from files on
    the first start (no securityadmin run)."""
    pem = {"pemcert_filepath": "node.crt", "pemkey_filepath": "node.key", "pemtrustedcas_filepath": "ca.pem"}
    lines = [f"plugins.security.ssl.transport.{key}: {value}" for key, value in pem.items()]
    lines += [f"plugins.security.ssl.http.{key}: {value}" for key, value in pem.items()]
    return [
        "# Written by FleetSight: the security plugin (pipelines/opensearch_security.py).",
        *lines,
        "plugins.security.ssl.http.enabled: true",
        # One node, addressed as 127.0.0.1: its peer is itself, admitted by DN below.
        "plugins.security.ssl.transport.enforce_hostname_verification: false",
        f'plugins.security.nodes_dn: ["CN={NODE_CN}"]',
        "plugins.security.allow_default_init_securityindex: true",
        "plugins.security.restapi.roles_enabled: []",
        "plugins.security.system_indices.enabled: true",
        "",
    ]


def configure_node(
    config_dir: Path,
    secrets_dir: Path,
    document: dict[str, Any] | None = None,
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
) -> Path:
    """Turn the config folder of an instance prepared from :func:`~pipelines.opensearch_install.
    opensearch_secured_home` into a secured one: a fresh CA and node certificate (made now, never
    committed), the settings, and the plugin's files for the model's users, whose passwords are in
    secrets_dir. Owned by the user OpenSearch runs as. Returns the CA file clients verify it with."""
    tls = config_dir / "tls-staging"
    tls.mkdir(mode=0o700)
    old = os.umask(0o077)
    try:
        make_certificates(tls, hosts, cn=NODE_CN, keep_parts=True)
    finally:
        os.umask(old)
    shutil.move(tls / "broker.crt", config_dir / "node.crt")
    shutil.move(tls / "broker.key", config_dir / "node.key")
    shutil.move(tls / "ca.pem", config_dir / "ca.pem")
    shutil.rmtree(tls)  # the CA key goes: no other certificate will ever be signed with it
    with (config_dir / "opensearch.yml").open("a") as settings:
        settings.write("\n".join(node_settings()))
    folder = config_dir / SECURITY_DIR
    folder.mkdir(exist_ok=True)
    for name, content in security_files(secrets_dir, document).items():
        write_private(folder / name, yaml.safe_dump(content, sort_keys=False))
    user = opensearch_run_as()
    if user:
        chown_tree(config_dir, user)
    return config_dir / "ca.pem"
