"""Maven artifacts for ``fleetsight licences``: each jar's licence from its pom's ``<licenses>`` (embedded,
or in ~/.m2 with the parents it inherits from), its manifest's Bundle-License or the licence file inside
it, and a distribution zip's. Its own module: poms, jars and ~/.m2 are a world of their own.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

from .licences_classify import Artifact, classify_files, classify_text, licence_files, licence_ref, normalise

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
