"""`fleetsight licences` (deploy/licences*.py): the inventory of this checkout passes the policy, an AGPL
artifact added on purpose (real files under a root the inventory is pointed at) fails it, and
docs/licences.md is what the generator writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from deploy import licences
from deploy import licences_classify as classify
from deploy import licences_collect as collect
from deploy import licences_render as render
from deploy.licences_classify import Artifact
from deploy.licences_collect import Roots

AGPL_TEXT = """                    GNU AFFERO GENERAL PUBLIC LICENSE
                       Version 3, 19 November 2007

 Copyright (C) 2007 Free Software Foundation, Inc. <https://fsf.org/>
"""
GPL3_TEXT = """                    GNU GENERAL PUBLIC LICENSE
                       Version 3, 29 June 2007
  13. Use with the GNU Affero General Public License.
"""
BSD3_TEXT = """Redistribution and use in source and binary forms, with or without modification, are permitted
3. Neither the name of the copyright holder nor the names of its contributors may be used"""


@pytest.fixture(scope="module")
def rows() -> list[classify.Row]:
    return licences.run_inventory()


def test_this_checkout_has_no_denied_or_unknown_licence(rows: list[classify.Row]) -> None:
    assert not classify.failing(rows), render.failure_message(rows)
    kinds = {r.artifact.kind for r in rows}
    # every source was read: an empty cache or a broken reader would pass with nothing listed
    assert {"python", "python:elastalert", "go", "maven", "npm", "debian", "model"} <= kinds, kinds
    thanos = [r for r in rows if r.artifact.kind == "go" and r.artifact.name == "github.com/thanos-io/thanos"]
    assert thanos and thanos[0].artifact.licence == "Apache-2.0"


def test_docs_licences_md_is_current(rows: list[classify.Row]) -> None:
    expected = render.markdown(rows, render.operator_images(Roots().repo, classify.load_policy()))
    assert render.DOC_FILE.read_text() == expected, "stale: run `fleetsight licences --format markdown`"


def shadow_venv(real: Path, target: Path) -> Path:
    """A venv whose site-packages links every entry of the real one, so that only what a test adds
    differs."""
    site = target / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    for entry in collect.site_packages(real)[0].iterdir():
        (site / entry.name).symlink_to(entry)
    return site


def test_an_agpl_python_distribution_fails_the_cli(tmp_path: Path) -> None:
    site = shadow_venv(Roots().venv, tmp_path / "venv")
    info = site / "evil_agpl-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.4\nName: evil-agpl\nVersion: 1.0\n"
                                   "License-Expression: AGPL-3.0-or-later\n")  # fmt: skip
    result = CliRunner().invoke(licences.cli, ["--json", "--venv", str(tmp_path / "venv")])
    assert result.exit_code == 1, result.output
    listed = {row["name"]: row for row in json.loads(result.stdout)}
    assert listed["evil-agpl"]["verdict"] == "denied"
    assert "denied: python evil-agpl 1.0 [AGPL-3.0-or-later]" in result.stderr
    assert "1 artifact(s) denied or of unknown licence" in result.stderr  # nothing else fails


def shadow_modcache(real: Path, target: Path, module_dir: str) -> Path:
    """A module cache linking the real one's entries along module_dir's path, except module_dir itself,
    which is a real, empty folder for the test to fill."""
    current_real, current = real, target
    parts = Path(module_dir).parts
    for depth, part in enumerate(parts):
        current.mkdir(parents=True, exist_ok=True)
        for entry in current_real.iterdir():
            if entry.name != part:
                (current / entry.name).symlink_to(entry)
        current_real, current = current_real / part, current / part
        if depth == len(parts) - 1:
            current.mkdir()
    return current


def test_an_agpl_go_module_in_a_built_binary_fails(tmp_path: Path) -> None:
    roots = Roots()
    helm = roots.cache_dir / "bin" / "helm"
    assert helm.is_file(), "helm is not built: run `fleetsight setup`"
    module, version = next(m for m in collect.go_binary_modules(helm) if m[0].startswith("github.com/"))
    real_cache = collect.gomodcache(roots)
    folder = shadow_modcache(real_cache, tmp_path / "mod", f"{collect.go_module_escape(module)}@{version}")
    (folder / "LICENSE").write_text(AGPL_TEXT)
    rows = licences.run_inventory(Roots(gomodcache=tmp_path / "mod"))
    bad = classify.failing(rows)
    assert [(r.artifact.name, r.artifact.licence, r.verdict) for r in bad] == [
        (module, "AGPL-3.0-only", "denied")
    ], render.failure_message(rows)


def test_a_go_module_whose_source_left_the_cache_is_unknown(tmp_path: Path) -> None:
    artifact = collect.go_module_artifact(tmp_path, "example.com/Gone", "v1.0.0", "helm")
    assert "source not in cache" in artifact.note
    assert classify.judge(artifact, classify.load_policy()).verdict == "unknown"


def test_an_exception_never_covers_a_denied_licence() -> None:
    policy = classify.load_policy()
    artifact = Artifact("debian", "rsyslog", "1", "AGPL-3.0-only", "copyright", "rsyslog")
    assert policy.exception_for("debian", "rsyslog") is not None
    assert classify.judge(artifact, policy).verdict == "denied"
    gpl = Artifact("debian", "rsyslog", "1", "GPL-3.0-or-later AND Apache-2.0", "copyright", "rsyslog")
    assert classify.judge(gpl, policy).verdict == "excepted"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (AGPL_TEXT, "AGPL-3.0-only"),
        (GPL3_TEXT, "GPL-3.0-only"),  # its section 13 names the AGPL: that is not the AGPL
        (BSD3_TEXT, "BSD-3-Clause"),
        ("Permission is hereby granted, free of charge, to any person", "MIT"),
        ("Licensed under the Elastic License 2.0", "Elastic-2.0"),
        ("Server Side Public License\nVERSION 1", "SSPL-1.0"),
        ("just some words", ""),
    ],
)
def test_licence_texts_are_classified_by_their_key_phrases(text: str, expected: str) -> None:
    assert classify.classify_text(text) == expected


@pytest.mark.parametrize(
    ("expression", "verdict"),
    [
        ("MIT OR Apache-2.0", "allowed"),
        ("Elastic-2.0 OR SSPL-1.0 OR AGPL-3.0-only", "denied"),
        ("Apache-2.0 AND AGPL-3.0-only", "denied"),
        ("Apache-2.0 WITH Commons-Clause", "denied"),
        ("GPL-2.0-only", "unknown"),
        ("CDDL-1.1 OR (GPL-2.0-only WITH Classpath-exception-2.0)", "allowed"),
        ("", "unknown"),
    ],
)
def test_expressions_are_judged_by_the_policy(expression: str, verdict: str) -> None:
    assert classify.evaluate(expression, classify.load_policy()) == verdict


def test_names_in_metadata_normalise_to_spdx() -> None:
    assert classify.normalise("The MIT License (MIT)") == "MIT"
    assert classify.normalise("GPL-2+ or Apache-2.0") == "GPL-2.0-or-later OR Apache-2.0"
    assert classify.normalise("The Apache Software License, Version 2.0") == "Apache-2.0"
    assert classify.normalise("CDDL 1.1") == "CDDL-1.1"
