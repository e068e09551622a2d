"""``fleetsight licences``: the licence of every artifact that ``fleetsight setup`` and the Python packages
bring in, as each artifact's own metadata declares it, checked against the policy in deploy/licences.yml.

What is listed comes from the install steps themselves (:func:`fleetsight.setup.load_steps`), not from
scanning caches: a stale leftover in the Go module cache or ~/.m2 (an old Grafana build) is not something
setup brings in. Per step:

- apt steps: each named Debian package, licence from /usr/share/doc/PKG/copyright (``License:`` fields);
- Go builds (:class:`fleetsight.gobuild.GoModuleBuild`): the built binary's main module and every
  dependency (``go version -m``), licence classified from the module's LICENSE/COPYING in GOMODCACHE;
- the other steps as licences.yml maps them: a private venv (Python metadata), Maven folders (each jar's
  pom ``<licenses>``, embedded or in ~/.m2), an npm tree (package.json ``license``), a model's NOTICE.

Plus the project's own .venv (every installed distribution; uv.lock entries that are not installed are
listed as such). Every root is configurable (:class:`Roots`), so tests feed it fake artifacts as files.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import inspect
import json
import os
import re
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import click
import yaml

from fleetsight.registry import REPO_ROOT

POLICY_FILE = Path(__file__).with_name("licences.yml")
DOC_FILE = REPO_ROOT / "docs" / "licences.md"
FAILING = ("denied", "unknown")

# -- licence names and texts -> SPDX ----------------------------------------------------------------

# Key phrases of licence texts, most specific first: the AGPL and LGPL texts mention the GPL, so a GPL
# match only counts when neither matched (see classify_text).
TEXT_PHRASES: tuple[tuple[str, str], ...] = (
    (r"GNU AFFERO GENERAL PUBLIC LICENSE", "AGPL-3.0-only"),
    (r"Server Side Public License", "SSPL-1.0"),
    (r"Business Source License", "BUSL-1.1"),
    (r"Elastic License 2\.0|ELASTIC LICENSE AGREEMENT", "Elastic-2.0"),
    (r"Commons Clause", "Commons-Clause"),
    (r"GNU LESSER GENERAL PUBLIC LICENSE\s+Version 3", "LGPL-3.0-only"),
    (r"GNU LESSER GENERAL PUBLIC LICENSE\s+Version 2\.1|GNU LIBRARY GENERAL PUBLIC", "LGPL-2.1-only"),
    (r"GNU GENERAL PUBLIC LICENSE\s+Version 3", "GPL-3.0-only"),
    (r"GNU GENERAL PUBLIC LICENSE\s+Version 2", "GPL-2.0-only"),
    (r"Apache License,?\s+Version 2\.0|Licensed under the Apache License", "Apache-2.0"),
    (r"Mozilla Public License,?\s+[Vv]ersion 2\.0", "MPL-2.0"),
    (r"Eclipse Public License - v 2\.0", "EPL-2.0"),
    (r"CC0 1\.0 Universal", "CC0-1.0"),
    (r"free and unencumbered software released into the public domain", "Unlicense"),
    (r"Permission to use, copy, modify, and(/or)? distribute this software for any\s+purpose", "ISC"),
    (r"Permission is hereby granted, free of charge", "MIT"),
    (r"Boost Software License", "BSL-1.0"),
    (r"provided ['‘]as-is['’], without any express or implied\s+warranty", "Zlib"),
)
BSD_PHRASE = r"Redistribution and use in source and binary forms"
BSD3_PHRASE = r"(Neither the name|names of its\s+contributors|name of the copyright holder)"

# Names that metadata fields use (Python License/classifiers, Maven <name>, Debian short names), lower
# case, -> SPDX. Ids that are already SPDX pass through :func:`spdx_id`.
ALIASES: dict[str, str] = {
    "apache": "Apache-2.0",
    "apache 2": "Apache-2.0",
    "apache 2.0": "Apache-2.0",
    "apache license 2.0": "Apache-2.0",
    "apache license, version 2.0": "Apache-2.0",
    "apache license version 2.0": "Apache-2.0",
    "apache software license": "Apache-2.0",
    "apache software license 2.0": "Apache-2.0",
    "apache-2": "Apache-2.0",
    "apache2": "Apache-2.0",
    "the apache license, version 2.0": "Apache-2.0",
    "the apache software license, version 2.0": "Apache-2.0",
    "asl 2.0": "Apache-2.0",
    "mit license": "MIT",
    "the mit license": "MIT",
    "mit no attribution license (mit-0)": "MIT-0",
    "expat": "MIT",
    "bsd 3-clause license": "BSD-3-Clause",
    "3-clause bsd license": "BSD-3-Clause",
    "bsd-3-clause": "BSD-3-Clause",
    "bsd-2-clause": "BSD-2-Clause",
    "new bsd license": "BSD-3-Clause",
    "the bsd license": "BSD-3-Clause",
    "bsd licence 3": "BSD-3-Clause",
    "mozilla public license 2.0 (mpl 2.0)": "MPL-2.0",
    "mozilla public license version 2.0": "MPL-2.0",
    "python software foundation license": "PSF-2.0",
    "psfl": "PSF-2.0",
    "psf": "PSF-2.0",
    "isc license (iscl)": "ISC",
    "eclipse public license - v 2.0": "EPL-2.0",
    "eclipse public license v2.0": "EPL-2.0",
    "eclipse distribution license - v 1.0": "BSD-3-Clause",
    "public domain": "LicenseRef-public-domain",
    "public-domain": "LicenseRef-public-domain",
    "gnu general public license v2 (gplv2)": "GPL-2.0-only",
    "gnu general public license v3 (gplv3)": "GPL-3.0-only",
    "gnu lesser general public license v2 or later (lgplv2+)": "LGPL-2.0-or-later",
    "gnu lesser general public license v3 (lgplv3)": "LGPL-3.0-only",
    "gnu affero general public license v3": "AGPL-3.0-only",
    "gnu affero general public license v3 or later (agplv3+)": "AGPL-3.0-or-later",
    "lgpl-2.1-or-later": "LGPL-2.1-or-later",
    "server side public license": "SSPL-1.0",
    "elastic license 2.0": "Elastic-2.0",
    "bouncy castle licence": "MIT",
    "zlib": "Zlib",
    "gpl-2 with linux-syscall-note exception": "GPL-2.0-only WITH Linux-syscall-note",
}
# Classifier or name that says "BSD" or "dual" without saying which: read the licence file instead.
AMBIGUOUS = {"bsd", "bsd license", "dual license", "unknown", "", "other/proprietary license"}
DEBIAN_SHORT = re.compile(r"^(L?GPL|AGPL)-(\d(?:\.\d)?)(\+?)$", re.IGNORECASE)
SPDX_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+-]*$")


@cache
def known_spdx() -> frozenset[str]:
    """The SPDX ids the policy names, plus common ones that need no alias (case-insensitive lookup)."""
    policy = load_policy()
    extra = ["GPL-2.0-only", "GPL-3.0-only", "GPL-2.0-or-later", "GPL-3.0-or-later", "LGPL-2.1-only"]
    extra += ["LGPL-3.0-only", "LGPL-2.1-or-later", "LGPL-3.0-or-later", "AGPL-3.0-only"]
    extra += ["AGPL-3.0-or-later", "SSPL-1.0", "BUSL-1.1", "Elastic-2.0", "Linux-syscall-note"]
    return frozenset([*policy.allowed, *extra])


def spdx_id(name: str, patterns: bool = True) -> str:
    """One licence name -> its SPDX id, or "" when it names none we know."""
    clean = name.strip()
    if clean.startswith("(") and clean.endswith(")"):
        clean = clean[1:-1].strip()
    lowered = clean.lower()
    if lowered in ALIASES:
        return ALIASES[lowered]
    for known in known_spdx():
        if known.lower() == lowered:
            return known
    debian = DEBIAN_SHORT.match(clean)
    if debian:
        family, version, later = debian.groups()
        version = version if "." in version else f"{version}.0"
        return f"{family.upper()}-{version}-{'or-later' if later else 'only'}"
    if lowered.startswith("licenseref-"):
        return clean
    return name_pattern(lowered) if patterns and len(lowered) < 100 else ""


# Patterns for the free-form names poms and manifests use ("The MIT License (MIT)", "CDDL 1.1",
# "GPL2 w/ CPE"), tried after the exact aliases; first match wins.
NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"affero", "AGPL-3.0-only"),
    (r"server side public", "SSPL-1.0"),
    (r"\belastic license", "Elastic-2.0"),
    (r"gpl.*(classpath|cpe)", "GPL-2.0-only WITH Classpath-exception-2.0"),
    (r"\bcddl\b.*1\.1|common development and distribution license.*1\.1", "CDDL-1.1"),
    (r"\bcddl\b|common development and distribution license", "CDDL-1.0"),
    (r"lesser general public license.*2\.1|\blgpl.?2\.1", "LGPL-2.1-only"),
    (r"eclipse public license.*2\.0|\bepl.?2", "EPL-2.0"),
    (r"eclipse public license.*1\.0|\bepl.?1", "EPL-1.0"),
    (r"eclipse distribution license", "BSD-3-Clause"),
    (r"apache.*2(\.0)?\b", "Apache-2.0"),
    (r"^(the )?mit( license)?( \(mit\))?$", "MIT"),
    (r"bsd.?2|simplified bsd|freebsd", "BSD-2-Clause"),
    (r"bsd.?3|new bsd|revised bsd|^go license$", "BSD-3-Clause"),
    (r"^bsd( license)?$|^the bsd license$", "LicenseRef-BSD"),
    (r"bouncy castle", "MIT"),
    (r"public domain", "LicenseRef-public-domain"),
)


def name_pattern(lowered: str) -> str:
    return next((spdx for pattern, spdx in NAME_PATTERNS if re.search(pattern, lowered)), "")


def licence_ref(name: str) -> str:
    """An unrecognised name kept visible as a LicenseRef (unknown to the policy, so it fails until read)."""
    return "LicenseRef-" + (re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") or "none")


def normalise(expression: str, keep_unknown: bool = False) -> str:
    """A licence expression (SPDX, Debian's ``GPL-2+ or Apache-2.0``, a plain name) -> SPDX; "" when a term
    is not recognised, or (keep_unknown) that term as a ``LicenseRef-`` id."""
    # a name with no operator is one name ("The MIT License (MIT)"); otherwise exact names first, then
    # term by term (a pattern on a whole "GPL-2+ or Apache-2.0" would see only "Apache"), then patterns
    # on the whole (a name with "and" in it: "Common Development and Distribution License")
    if not re.search(r"\s(and|or|with)\s", expression, re.IGNORECASE):
        return spdx_id(expression) or split_expression(expression, keep_unknown)
    exact = spdx_id(expression, patterns=False)
    return exact or split_expression(expression, keep_unknown) or spdx_id(expression)


def split_expression(expression: str, keep_unknown: bool) -> str:
    parts = re.split(r"(\s+(?:and|or|with)\s+|[()])", expression.strip(), flags=re.IGNORECASE)
    out = []
    for part in parts:
        if not part.strip():
            continue
        if part.strip().lower() in ("and", "or", "with") or part in "()":
            out.append(part.strip().upper() if part.strip().isalpha() else part)
            continue
        term = spdx_id(part)
        if not term and keep_unknown and SPDX_TOKEN.match(part.strip()):
            term = f"LicenseRef-{part.strip()}"
        if not term:
            return ""
        out.append(term)
    return " ".join(out).replace("( ", "(").replace(" )", ")")


def classify_text(text: str) -> str:
    """The SPDX expression a licence text's key phrases name ("" when none): several licences in one
    file (an appendix, vendored code) are joined with AND, which never allows more than the file does."""
    found: list[str] = []
    for phrase, spdx in TEXT_PHRASES:
        # licence titles are upper case: a GPL text's "Use with the GNU Affero General Public License"
        # section must not read as the AGPL itself
        flags = 0 if phrase.isupper() or "GNU" in phrase else re.IGNORECASE
        if re.search(phrase, text, flags):
            found.append(spdx)
    if re.search(BSD_PHRASE, text, re.IGNORECASE) and "ISC" not in found:
        found.append("BSD-3-Clause" if re.search(BSD3_PHRASE, text, re.IGNORECASE) else "BSD-2-Clause")
    return " AND ".join(dict.fromkeys(found))


def classify_files(paths: Iterable[Path]) -> str:
    """The combined classification of several licence files (LICENSE, COPYING, ...)."""
    found = [classify_text(p.read_text(errors="replace")) for p in sorted(paths) if p.is_file()]
    return " AND ".join(dict.fromkeys(f for f in found if f))


LICENCE_FILE = re.compile(r"^(LICEN[CS]E|COPYING|UNLICENSE)([-._].*)?$", re.IGNORECASE)


def licence_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if LICENCE_FILE.match(p.name) and p.is_file()]


# -- the policy -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exception_:
    kind: str
    name: str
    reason: str

    def covers(self, kind: str, name: str) -> bool:
        return fnmatch.fnmatch(kind, self.kind) and fnmatch.fnmatch(name.lower(), self.name.lower())


@dataclass(frozen=True)
class Policy:
    allowed: frozenset[str]
    denied: tuple[str, ...]
    steps: dict[str, dict[str, Any]]
    exceptions: tuple[Exception_, ...]
    operator_images: dict[str, str]

    def term(self, spdx: str) -> str:
        """'denied', 'allowed' or 'unknown' for one SPDX id."""
        if any(fnmatch.fnmatch(spdx, pattern) for pattern in self.denied):
            return "denied"
        return "allowed" if spdx in self.allowed else "unknown"

    def exception_for(self, kind: str, name: str) -> Exception_ | None:
        return next((e for e in self.exceptions if e.covers(kind, name)), None)


@cache
def load_policy(path: Path = POLICY_FILE) -> Policy:
    data = yaml.safe_load(path.read_text())
    return Policy(
        allowed=frozenset(data["allowed"]),
        denied=tuple(data["denied"]),
        steps=data.get("steps") or {},
        exceptions=tuple(Exception_(**e) for e in data.get("exceptions") or []),
        operator_images=data.get("operator_images") or {},
    )


def evaluate(expression: str, policy: Policy) -> str:
    """'allowed', 'denied' or 'unknown' for an SPDX expression: OR takes the best alternative, AND the
    worst term, WITH the worse of licence and exception; an empty expression is unknown."""
    tokens = re.findall(r"\(|\)|[^\s()]+", expression)
    if not tokens:
        return "unknown"
    verdict, rest = _or_expression(tokens, policy)
    return verdict if not rest else "unknown"


RANK = {"allowed": 0, "unknown": 1, "denied": 2}


def _or_expression(tokens: list[str], policy: Policy) -> tuple[str, list[str]]:
    verdict, tokens = _and_expression(tokens, policy)
    while tokens and tokens[0].upper() == "OR":
        other, tokens = _and_expression(tokens[1:], policy)
        verdict = min(verdict, other, key=RANK.__getitem__)
    return verdict, tokens


def _and_expression(tokens: list[str], policy: Policy) -> tuple[str, list[str]]:
    verdict, tokens = _term(tokens, policy)
    while tokens and tokens[0].upper() in ("AND", "WITH"):
        other, tokens = _term(tokens[1:], policy)
        verdict = max(verdict, other, key=RANK.__getitem__)
    return verdict, tokens


def _term(tokens: list[str], policy: Policy) -> tuple[str, list[str]]:
    if not tokens:
        return "unknown", []
    if tokens[0] == "(":
        verdict, rest = _or_expression(tokens[1:], policy)
        return verdict, rest[1:] if rest[:1] == [")"] else rest
    # a WITH exception (Linux-syscall-note, Classpath-exception) only ever widens what the licence allows
    if "exception" in tokens[0].lower() or tokens[0] == "Linux-syscall-note":
        return "allowed", tokens[1:]
    return policy.term(tokens[0]), tokens[1:]


# -- artifacts --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Artifact:
    kind: str  # python, python:<venv>, go, maven, npm, debian, model, step
    name: str
    version: str
    licence: str  # SPDX expression; "" when no metadata declares one
    source: str  # where the licence was read
    via: str  # what brings it in (an install step, the project's venv)
    note: str = ""  # why the licence is unknown, when it is


@dataclass(frozen=True)
class Row:
    artifact: Artifact
    verdict: str  # allowed, excepted, denied, unknown, not-installed
    reason: str = ""


@dataclass(frozen=True)
class Roots:
    """Where each kind of artifact is read; every one can be pointed elsewhere (tests, another machine)."""

    repo: Path = REPO_ROOT
    cache_dir: Path = field(
        default_factory=lambda: Path(os.environ.get("FLEETSIGHT_CACHE_DIR", REPO_ROOT / ".cache"))
    )
    venv: Path = REPO_ROOT / ".venv"
    gomodcache: Path | None = None  # None: `go env GOMODCACHE` with setup's environment
    m2: Path = Path.home() / ".m2" / "repository"
    debian_doc: Path = Path("/usr/share/doc")


def site_packages(venv: Path) -> list[Path]:
    return sorted(venv.glob("lib/python3*/site-packages"))


# -- Python -----------------------------------------------------------------------------------------


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def python_licence(dist: importlib.metadata.Distribution) -> tuple[str, str]:
    """(SPDX expression, which field said so) from License-Expression, License, the classifiers, then
    the licence files the distribution ships."""
    meta = dist.metadata
    expression = (meta.get("License-Expression") or "").strip()
    if expression:
        return normalise(expression), "License-Expression"
    licence = (meta.get("License") or "").strip()
    short = licence if "\n" not in licence and len(licence) < 80 else ""
    if short.lower() not in AMBIGUOUS and normalise(short):
        return normalise(short), "License"
    classifiers = [
        c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License ::")
    ]
    named = [spdx_id(c) for c in classifiers if c.lower() not in AMBIGUOUS | {"osi approved"}]
    if named and all(named) and "BSD License" not in classifiers:
        return " AND ".join(dict.fromkeys(named)), "Classifier"
    from_files = classify_files(python_licence_files(dist)) or (classify_text(licence) if licence else "")
    if from_files:
        return from_files, "License-File"
    # only "BSD" said and no file to tell which: the family name (every BSD variant is permissive)
    vague = [name_pattern(n.lower()) for n in [short, *classifiers] if n]
    return next((v for v in vague if v), ""), "License/Classifier (vague)"


def python_licence_files(dist: importlib.metadata.Distribution) -> list[Path]:
    files = []
    for entry in dist.files or []:
        path = Path(str(dist.locate_file(entry)))
        if ".dist-info" in str(entry) and LICENCE_FILE.match(path.name):
            files.append(path)
    return files


def python_artifacts(venv: Path, kind: str, via: str) -> list[Artifact]:
    paths = [str(p) for p in site_packages(venv)]
    artifacts = []
    for dist in importlib.metadata.distributions(path=paths):
        licence, source = python_licence(dist)
        note = "" if licence else "no licence in its metadata"
        name = dist.metadata["Name"]
        artifacts.append(Artifact(kind, canonical(name), dist.version, licence, source, via, note))
    return artifacts


def lock_only(repo: Path, installed: Iterable[Artifact]) -> list[Artifact]:
    """uv.lock packages that are not installed here (another platform's, a never-installed override)."""
    lock_file = repo / "uv.lock"
    if not lock_file.is_file():
        return []
    names = {a.name for a in installed}
    packages = tomllib.loads(lock_file.read_text()).get("package", [])
    return [
        Artifact(
            "python", canonical(p["name"]), p.get("version", ""), "", "uv.lock", "uv.lock", "not installed"
        )
        for p in packages
        if canonical(p["name"]) not in names
    ]


# -- Go ---------------------------------------------------------------------------------------------


def go_module_escape(path: str) -> str:
    """The module cache's spelling of a module path: upper-case letters become ``!`` + lower case."""
    return re.sub(r"[A-Z]", lambda m: "!" + m.group(0).lower(), path)


def gomodcache(roots: Roots) -> Path:
    if roots.gomodcache is not None:
        return roots.gomodcache
    from fleetsight.setup import go_env  # the environment setup built with: its module cache

    result = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, env=go_env(), check=False
    )
    return Path(result.stdout.strip() or Path.home() / "go" / "pkg" / "mod")


def go_binary_modules(binary: Path) -> list[tuple[str, str]]:
    """(module, version) of the binary's main module and every dependency, replacements applied."""
    result = subprocess.run(["go", "version", "-m", str(binary)], capture_output=True, text=True, check=False)
    modules: list[tuple[str, str]] = []
    for line in result.stdout.splitlines():
        fields = line.split()
        if not fields or fields[0] not in ("mod", "dep", "=>"):
            continue
        entry = (fields[1], fields[2] if len(fields) > 2 else "")
        if fields[0] == "=>":  # the line before is replaced by this one
            modules[-1] = entry
        else:
            modules.append(entry)
    return modules


def go_module_artifact(cache_root: Path, module: str, version: str, via: str) -> Artifact:
    folder = cache_root / f"{go_module_escape(module)}@{version}"
    if not folder.is_dir():
        note = "unknown (source not in cache): `fleetsight setup` puts it back"
        return Artifact("go", module, version, "", "GOMODCACHE", via, note)
    files = licence_files(folder)
    licence = classify_files(files)
    source = ", ".join(sorted(p.name for p in files)) or "no LICENSE/COPYING file"
    note = "" if licence else ("no licence file" if not files else "licence text not recognised")
    return Artifact("go", module, version, licence, source, via, note)


def go_artifacts(binaries: dict[Path, tuple[str, str, str]], cache_root: Path) -> list[Artifact]:
    """One row per module@version across the binaries (kube-* share most of theirs). binaries: path ->
    (step, pinned module, pinned version)."""
    users: dict[tuple[str, str], list[str]] = {}
    missing = []
    for binary, (step, pinned, pinned_version) in sorted(binaries.items()):
        if not binary.is_file():
            missing.append(
                Artifact("go", binary.name, "", "", "", step, "binary not built: run `fleetsight setup`")
            )
            continue
        for module in go_binary_modules(binary):
            # built from a copy of the module's source, the main module reads "(devel)": it is the pin;
            # any other "(devel)" is setup's own wrapper module (the kube build), no third-party code
            if module == (pinned, "(devel)"):
                module = (pinned, pinned_version)
            if module[1] != "(devel)":
                users.setdefault(module, []).append(binary.name)
    rows = [go_module_artifact(cache_root, m, v, ", ".join(sorted(u))) for (m, v), u in sorted(users.items())]
    return rows + missing


# -- Maven ------------------------------------------------------------------------------------------

POM_NS = re.compile(r"\{[^}]*\}")


def xml_tree(text: bytes) -> ET.Element | None:
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return None
    for element in root.iter():
        element.tag = POM_NS.sub("", element.tag)
    return root


def pom_licences(pom: ET.Element) -> str:
    """A pom's ``<licenses>`` as SPDX; several are a choice (Maven's own reading), hence OR."""
    found = []
    for licence in pom.findall("./licenses/license"):
        name = (licence.findtext("name") or "").strip()
        url = (licence.findtext("url") or "").strip()
        found.append(normalise(name) or url_licence(url) or licence_ref(name or url))
    return " OR ".join(f"({f})" if " " in f else f for f in found if f)


def url_licence(url: str) -> str:
    known = {
        "apache.org/licenses/license-2.0": "Apache-2.0",
        "opensource.org/licenses/mit": "MIT",
        "opensource.org/licenses/bsd-3-clause": "BSD-3-Clause",
        "eclipse.org/legal/epl-2.0": "EPL-2.0",
        "eclipse.org/org/documents/edl-v10": "BSD-3-Clause",
        "bouncycastle.org/licence": "MIT",
        "epl-v10": "EPL-1.0",
        "edl-v10": "BSD-3-Clause",
    }
    lowered = url.lower()
    return next((spdx for key, spdx in known.items() if key in lowered), "")


class MavenRepo:
    """~/.m2: the poms of the artifacts Maven fetched, with their parents (licences are inherited)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def pom_path(self, group: str, artifact: str, version: str) -> Path:
        return self.root / group.replace(".", "/") / artifact / version / f"{artifact}-{version}.pom"

    def find(self, artifact: str, version: str) -> Path | None:
        """The pom of artifact-version in any group (a jar copied out of ~/.m2 keeps only that name)."""
        matches = sorted(self.root.glob(f"**/{artifact}/{version}/{artifact}-{version}.pom"))
        return matches[0] if matches else None

    def licences(self, pom: ET.Element, depth: int = 0) -> str:
        own = pom_licences(pom)
        parent = pom.find("parent")
        if own or parent is None or depth > 8:
            return own
        coords = [(parent.findtext(k) or "").strip() for k in ("groupId", "artifactId", "version")]
        path = self.pom_path(*coords)
        tree = xml_tree(path.read_bytes()) if path.is_file() else None
        return self.licences(tree, depth + 1) if tree is not None else ""


JAR_NAME = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d[^-]*(?:-\d+)?(?:\.Final)?)\.jar$")


def embedded_pom(jar: zipfile.ZipFile) -> ET.Element | None:
    names = sorted(n for n in jar.namelist() if n.startswith("META-INF/maven/") and n.endswith("/pom.xml"))
    return xml_tree(jar.read(names[0])) if names else None


def manifest_licence(jar: zipfile.ZipFile) -> str:
    try:
        manifest = jar.read("META-INF/MANIFEST.MF").decode(errors="replace")
    except KeyError:
        return ""
    match = re.search(r"^Bundle-License:\s*(.+(?:\n .+)*)", manifest, re.MULTILINE)
    value = match.group(1).replace("\r", "").replace("\n ", "") if match else ""
    # a list of licences (names or URLs, ";" for attributes) is a choice, as in a pom
    names = [v.split(";")[0].strip() for v in value.split(",") if v.strip()]
    found = [normalise(n) or url_licence(n) for n in names]
    return " OR ".join(found) if found and all(found) else ""


def jar_licence_text(jar: zipfile.ZipFile) -> str:
    names = [n for n in jar.namelist() if re.match(r"META-INF/LICEN[CS]E(\.txt|\.md)?$", n, re.IGNORECASE)]
    return " AND ".join(filter(None, (classify_text(jar.read(n).decode(errors="replace")) for n in names)))


def jar_artifact(path: Path, repo: MavenRepo, via: str) -> Artifact:
    """A jar's coordinates and licence: its pom (embedded, or in ~/.m2 with its parents), then the
    manifest's Bundle-License, then the licence file inside the jar."""
    match = JAR_NAME.match(path.name)
    artifact, version = (match["artifact"], match["version"]) if match else (path.stem, "")
    with zipfile.ZipFile(path) as jar:
        pom = embedded_pom(jar)
        outside = repo.find(artifact, version)
        poms = [p for p in (pom, xml_tree(outside.read_bytes()) if outside else None) if p is not None]
        for tree in poms:
            licence = repo.licences(tree)
            if licence:
                return Artifact("maven", artifact, version, licence, "pom <licenses>", via)
        for reader, source in ((manifest_licence, "Bundle-License"), (jar_licence_text, "META-INF/LICENSE")):
            licence = reader(jar)
            if licence:
                return Artifact("maven", artifact, version, licence, source, via)
    return Artifact("maven", artifact, version, "", "", via, "no pom, manifest or licence file declares one")


def maven_artifacts(folders: list[Path], repo: MavenRepo, via: str) -> list[Artifact]:
    jars = sorted({p for folder in folders for p in folder.rglob("*.jar")}, key=lambda p: p.name)
    seen: dict[str, Artifact] = {}
    for jar in jars:
        seen.setdefault(jar.name, jar_artifact(jar, repo, via))
    return list(seen.values())


def distribution_artifact(spec: dict[str, str], cache_dir: Path, repo: MavenRepo, via: str) -> Artifact:
    """A distribution zip (OpenSearch, a plugin): its pom's licences, else the LICENSE it ships."""
    home = cache_dir / spec["home"]
    group, artifact = spec["name"].split(":")
    stamps = sorted(home.glob(spec["version_from"]))
    found = JAR_NAME.match(stamps[0].name) if stamps else None
    version = found["version"] if found else ""
    pom = repo.pom_path(group, artifact, version)
    tree = xml_tree(pom.read_bytes()) if pom.is_file() else None
    licence = repo.licences(tree) if tree is not None else ""
    if licence:
        return Artifact("maven", spec["name"], version, licence, "pom <licenses>", via)
    licence = classify_files(licence_files(home))
    note = "" if licence else "neither a pom on Maven Central nor a LICENSE in the distribution"
    return Artifact("maven", spec["name"], version, licence, "its LICENSE (no pom published)", via, note)


# -- npm, Debian, the model -------------------------------------------------------------------------


def npm_packages(node_modules: Path) -> Iterator[Path]:
    for manifest in sorted(node_modules.rglob("package.json")):
        parent = manifest.parent
        owner = parent.parent if parent.parent.name.startswith("@") else parent
        if owner.parent.name == "node_modules":  # a package's own manifest, not a fixture inside it
            yield manifest


def npm_artifacts(node_modules: Path, via: str) -> list[Artifact]:
    artifacts = []
    for manifest in npm_packages(node_modules):
        data = json.loads(manifest.read_text())
        declared = data.get("license") or data.get("licenses") or ""
        if isinstance(declared, list):  # the old form: [{"type": "MIT"}, ...], a choice
            declared = " OR ".join(str(d.get("type", d)) if isinstance(d, dict) else str(d) for d in declared)
        if isinstance(declared, dict):
            declared = str(declared.get("type", ""))
        licence = normalise(declared)
        note = "" if licence else f"package.json says {declared!r}"
        artifacts.append(
            Artifact(
                "npm",
                data.get("name", manifest.parent.name),
                data.get("version", ""),
                licence,
                "package.json",
                via,
                note,
            )
        )
    return artifacts


def dpkg_version(package: str) -> str:
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def debian_artifact(package: str, doc_root: Path, via: str) -> Artifact:
    """A Debian package's licences: every ``License:`` of its machine-readable copyright file, ANDed."""
    copyright_file = doc_root / package / "copyright"
    version = dpkg_version(package)
    if not copyright_file.is_file():
        note = "not installed: run `fleetsight setup`" if not version else "no copyright file"
        return Artifact("debian", package, version, "", "", via, note)
    text = copyright_file.read_text(errors="replace")
    if not text.startswith("Format:"):
        licence = classify_text(text)
        return Artifact(
            "debian",
            package,
            version,
            licence,
            "copyright (free text)",
            via,
            "" if licence else "not machine-readable",
        )
    names = dict.fromkeys(m.strip() for m in re.findall(r"^License:[ \t]*(\S.*)$", text, re.MULTILINE))
    terms = dict.fromkeys(normalise(n, keep_unknown=True) or licence_ref(n) for n in names)
    licence = " AND ".join(f"({t})" if " " in t else t for t in terms)
    return Artifact("debian", package, version, licence, "copyright License:", via)


def model_artifacts(venv: Path, relative: str, via: str) -> list[Artifact]:
    """Each bundled model: the ``License:`` line of its NOTICE, else its LICENSE text."""
    artifacts = []
    for root in site_packages(venv):
        for folder in sorted(p for p in (root / relative).glob("*") if p.is_dir()):
            notice = folder / "NOTICE"
            stated = (
                re.search(r"^License:\s*(\S+)", notice.read_text(), re.MULTILINE)
                if notice.is_file()
                else None
            )
            licence = normalise(stated.group(1)) if stated else classify_files(licence_files(folder))
            source = "NOTICE License:" if stated else "LICENSE"
            name = folder.name.replace("__", "/")
            artifacts.append(
                Artifact("model", name, "", licence, source, via, "" if licence else "no licence")
            )
    return artifacts


# -- from the install steps -------------------------------------------------------------------------


@dataclass
class StepPlan:
    """What the install steps bring in, sorted by how it is read."""

    go_binaries: dict[Path, tuple[str, str, str]] = field(default_factory=dict)
    go_sources: list[tuple[str, str, str]] = field(default_factory=list)
    debian: dict[str, str] = field(default_factory=dict)
    mapped: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)


def plan_steps(steps: Iterable[Any], policy: Policy, cache_dir: Path) -> StepPlan:
    from fleetsight.gobuild import GoModuleBuild

    plan = StepPlan()
    for step in steps:
        owner = getattr(step.check, "__self__", None)
        packages = (
            inspect.getclosurevars(step.check).nonlocals.get("packages")
            if inspect.isfunction(step.check)
            else None
        )
        if isinstance(owner, GoModuleBuild):
            binary = cache_dir / "bin" / owner.binary_name
            plan.go_binaries[binary] = (step.name, owner.module, owner.module_version)
        elif isinstance(packages, dict):  # an apt_step: its package names
            plan.debian.update({p: step.name for p in packages})
        elif step.name in policy.steps:
            spec = policy.steps[step.name]
            if spec.get("go_source") and owner is not None:
                plan.go_sources.append((owner.module, owner.version, step.name))
            else:
                plan.mapped.append((step.name, spec))
        else:
            plan.unmapped.append(step.name)
    return plan


def mapped_artifacts(name: str, spec: dict[str, Any], roots: Roots, repo: MavenRepo) -> list[Artifact]:
    found: list[Artifact] = []
    if "python_venv" in spec:
        venv = roots.cache_dir / spec["python_venv"]
        found += python_artifacts(venv, f"python:{spec['python_venv']}", name) or [missing(name, venv)]
    distribution = None
    if "distribution" in spec:
        distribution = distribution_artifact(spec["distribution"], roots.cache_dir, repo, name)
        found.append(distribution)
    if "maven" in spec:
        folders = [roots.cache_dir / f for f in spec["maven"]]
        jars = maven_artifacts([f for f in folders if f.is_dir()], repo, name)
        found += [bundled(jar, distribution) for jar in jars]
        found += [missing(name, f) for f in folders if not f.is_dir()]
    if "npm" in spec:
        folder = roots.cache_dir / spec["npm"]
        found += npm_artifacts(folder, name) if folder.is_dir() else [missing(name, folder)]
    if "model" in spec:
        found += model_artifacts(roots.venv, spec["model"], name) or [missing(name, Path(spec["model"]))]
    return found


def bundled(jar: Artifact, distribution: Artifact | None) -> Artifact:
    """A jar that declares no licence of its own and came inside a distribution zip (no pom of it was
    fetched): the licence the distribution declares for what it ships, said so in the source column."""
    if jar.licence or distribution is None or not distribution.licence:
        return jar
    source = f"bundled in {distribution.name} (its declared licence)"
    return replace(jar, licence=distribution.licence, source=source, note="")


def missing(step: str, path: Path) -> Artifact:
    return Artifact("step", step, "", "", str(path), step, f"{path} not found: run `fleetsight setup`")


def inventory(roots: Roots, steps: Iterable[Any], policy: Policy) -> list[Artifact]:
    plan = plan_steps(steps, policy, roots.cache_dir)
    repo = MavenRepo(roots.m2)
    cache_root = gomodcache(roots)
    artifacts = python_artifacts(roots.venv, "python", "the project's .venv (uv.lock)")
    artifacts += lock_only(roots.repo, artifacts)
    artifacts += go_artifacts(plan.go_binaries, cache_root)
    artifacts += [go_module_artifact(cache_root, m, v, step) for m, v, step in plan.go_sources]
    artifacts += [debian_artifact(p, roots.debian_doc, step) for p, step in sorted(plan.debian.items())]
    for name, spec in plan.mapped:
        artifacts += mapped_artifacts(name, spec, roots, repo)
    note = "install step not inventoried: map it in deploy/licences.yml"
    artifacts += [Artifact("step", s, "", "", "", s, note) for s in plan.unmapped]
    return artifacts


def judge(artifact: Artifact, policy: Policy) -> Row:
    if artifact.note == "not installed":
        return Row(artifact, "not-installed", "in uv.lock for another platform or an override; not fetched")
    verdict = evaluate(artifact.licence, policy)
    exception = policy.exception_for(artifact.kind, artifact.name)
    if verdict == "denied":
        reason = "a denied licence: remove it from setup (exceptions never cover these)"
        return Row(artifact, "denied", reason)
    if verdict == "unknown" and exception is not None:
        return Row(artifact, "excepted", exception.reason)
    return Row(artifact, verdict, artifact.note if verdict == "unknown" else "")


def judge_all(artifacts: Iterable[Artifact], policy: Policy) -> list[Row]:
    rows = [judge(a, policy) for a in artifacts]
    return sorted(rows, key=lambda r: (r.artifact.kind, r.artifact.name, r.artifact.version))


# -- operator-run images ----------------------------------------------------------------------------

IMAGE_LINE = re.compile(r"^[ \t]*image:[ \t]*['\"]?([^'\"\s#]+)", re.MULTILINE)


def operator_images(repo: Path, policy: Policy) -> list[tuple[str, str]]:
    """(image, upstream's stated terms) of every upstream image the deployment files name."""
    texts = [(repo / "docker-compose.yml")]
    texts += sorted((repo / "deploy" / "helm").rglob("values*.yaml"))
    images = set(IMAGE_LINE.findall("\n".join(p.read_text() for p in texts if p.is_file())))
    tagged = {image.split(":")[0] for image in images}
    for values in texts[1:]:  # a chart's repository without its tag, unless a tagged one is listed
        found = re.findall(r"repository:[ \t]*['\"]?([a-z0-9./-]+/[a-z0-9._-]+)", values.read_text())
        images |= {image for image in found if image not in tagged}
    rows = []
    for image in sorted(images):
        bare = image.split(":")[0]
        if bare.startswith("fleetsight"):
            continue  # FleetSight's own image: its contents are the inventory above
        rows.append(
            (image, policy.operator_images.get(bare, "upstream's terms (not listed in licences.yml)"))
        )
    return rows


# -- output -----------------------------------------------------------------------------------------


def failing(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r.verdict in FAILING]


def licence_counts(rows: Iterable[Row]) -> Counter[str]:
    return Counter(r.artifact.licence or "(none declared)" for r in rows if r.verdict != "not-installed")


def cell(text: str) -> str:
    return text.replace("|", "\\|") or "-"


def markdown(rows: list[Row], images: list[tuple[str, str]]) -> str:
    lines = [
        "# Licences",
        "",
        "<!-- Generated by `fleetsight licences --format markdown` from deploy/licences.py and",
        "     deploy/licences.yml: do not edit by hand; tests/deploy/test_licences.py checks it. -->",
        "",
        "Every artifact that `fleetsight setup` and the Python packages bring in, with the licence its own",
        "metadata declares, checked against the policy in deploy/licences.yml (denied: AGPL, SSPL, BUSL,",
        "the Elastic License, Commons Clause, vendor terms).",
        "",
        "## Summary",
        "",
        "| licence | artifacts |",
        "|---|---|",
        *[f"| {cell(lic)} | {n} |" for lic, n in sorted(licence_counts(rows).items())],
        "",
        "Verdicts: "
        + ", ".join(f"{v} {n}" for v, n in sorted(Counter(r.verdict for r in rows).items()))
        + ".",
        "",
        "## Exceptions (reviewed)",
        "",
        "| artifact | kind | licence | why it may stay |",
        "|---|---|---|---|",
        *[
            f"| {cell(r.artifact.name)} | {r.artifact.kind} | {cell(r.artifact.licence)} | {cell(r.reason)} |"
            for r in rows
            if r.verdict == "excepted"
        ],
        "",
        "## Operator-run images, not shipped",
        "",
        "Unmodified upstream servers that docker-compose.yml and the Helm chart run from their official",
        "images, the operator's choice; setup never fetches or builds them. Terms as upstream states them.",
        "",
        "| image | upstream's terms |",
        "|---|---|",
        *[f"| {cell(image)} | {cell(terms)} |" for image, terms in images],
        "",
        "## Every artifact",
        "",
        "| artifact | version | kind | licence | verdict | brought in by |",
        "|---|---|---|---|---|---|",
        *[
            f"| {cell(r.artifact.name)} | {cell(documented_version(r.artifact))} | {r.artifact.kind} "
            f"| {cell(r.artifact.licence)} | {r.verdict} | {cell(r.artifact.via)} |"
            for r in rows
        ],
        "",
    ]
    return "\n".join(lines)


# Sources whose versions the repository does not pin: Debian's point releases, npm's and a private venv's
# transitive dependencies of a pinned requirement move under a fresh machine's setup, so the generated
# page names them without a version (their licences are still checked on every run).
FLOATING_KINDS = frozenset({"debian", "python:elastalert", "npm"})


def documented_version(artifact: Artifact) -> str:
    return "(as installed)" if artifact.kind in FLOATING_KINDS else artifact.version


def text_table(rows: list[Row]) -> str:
    header = ("artifact", "version", "kind", "licence", "verdict")
    body = [
        (r.artifact.name, r.artifact.version, r.artifact.kind, r.artifact.licence or "-", r.verdict)
        for r in rows
    ]
    widths = [min(60, max(len(str(x[i])) for x in [header, *body])) for i in range(5)]
    return "\n".join(
        "  ".join(str(c)[:60].ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in [header, *body]
    )


def summary(rows: list[Row]) -> str:
    counts = ", ".join(f"{lic}: {n}" for lic, n in licence_counts(rows).most_common())
    excepted = [f"  {r.artifact.kind} {r.artifact.name}: {r.reason}" for r in rows if r.verdict == "excepted"]
    return "\n".join([f"licences: {counts}", "exceptions:", *excepted])


def failure_message(rows: list[Row]) -> str:
    bad = failing(rows)
    lines = [f"licences: {len(bad)} artifact(s) denied or of unknown licence, not excepted:"]
    for r in bad:
        a = r.artifact
        lines.append(
            f"  {r.verdict}: {a.kind} {a.name} {a.version} [{a.licence or 'none'}] via {a.via}: {r.reason}"
        )
    lines.append("Remove a denied artifact from setup; for an unknown one read its licence, then fix the")
    lines.append("metadata reading or add a reviewed exception with its reason to deploy/licences.yml.")
    return "\n".join(lines)


def run_inventory(roots: Roots | None = None, policy_file: Path = POLICY_FILE) -> list[Row]:
    from fleetsight.setup import load_steps

    policy = load_policy(policy_file)
    return judge_all(inventory(roots or Roots(), load_steps(), policy), policy)


@click.command()
@click.option("--format", "output", type=click.Choice(["table", "markdown"]), default="table",
              help="table: print; markdown: write docs/licences.md (or --out).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print every row as JSON (for machines).")
@click.option("--out", type=click.Path(path_type=Path), default=DOC_FILE, help="Where markdown goes.")
@click.option("--venv", type=click.Path(path_type=Path), default=Roots.venv, help="The project's venv.")
@click.option("--gomodcache", type=click.Path(path_type=Path), default=None, help="Go's module cache.")
@click.option("--m2", type=click.Path(path_type=Path), default=Roots.m2, help="Maven's local repository.")
def cli(output: str, as_json: bool, out: Path, venv: Path, gomodcache: Path | None, m2: Path) -> None:
    """The licence of every artifact that setup and the packages bring in; exit 1 on any denied or
    unknown licence that no reviewed exception covers.

    \b
    Examples:
      fleetsight licences                      table and summary
      fleetsight licences --format markdown    regenerate docs/licences.md
      fleetsight licences --json               one JSON object per artifact
    """
    roots = Roots(venv=venv, gomodcache=gomodcache, m2=m2)
    rows = run_inventory(roots)
    if as_json:
        click.echo(
            json.dumps(
                [{**asdict(r.artifact), "verdict": r.verdict, "reason": r.reason} for r in rows], indent=1
            )
        )
    elif output == "markdown":
        out.write_text(markdown(rows, operator_images(roots.repo, load_policy())))
        click.echo(f"licences: wrote {out}", err=True)
    else:
        click.echo(text_table(rows))
        click.echo(summary(rows))
    if failing(rows):
        click.echo(failure_message(rows), err=True)
        sys.exit(1)
