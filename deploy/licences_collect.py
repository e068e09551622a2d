"""The artifacts ``fleetsight licences`` lists, read where each kind lives (:class:`Roots`): Python
distributions (a venv's metadata, uv.lock), Go modules (a built binary's ``go version -m``, their
LICENSE in GOMODCACHE), npm packages (package.json), Debian packages (/usr/share/doc/PKG/copyright) and a
bundled model (its NOTICE). Maven jars have their own module (licences_maven). Its own module: a source's
format changes apart from the policy and the report.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fleetsight.registry import REPO_ROOT

from .licences_classify import (
    AMBIGUOUS,
    LICENCE_FILE,
    Artifact,
    classify_files,
    classify_text,
    licence_files,
    licence_ref,
    name_pattern,
    normalise,
    spdx_id,
)


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
