"""Licences classified for ``fleetsight licences``: names and texts -> SPDX (metadata fields, Debian short
names, the key phrases of a LICENSE file), and the policy of deploy/licences.yml that judges an SPDX
expression allowed, denied or unknown (with its reviewed exceptions). Its own module: what counts as which
licence, and what is allowed, change apart from where artifacts are read and how the inventory is shown.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

POLICY_FILE = Path(__file__).with_name("licences.yml")
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


# -- artifacts and their verdicts ----------------------------------------------------------------------


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


def failing(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r.verdict in FAILING]
