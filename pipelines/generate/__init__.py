"""Both parsers of a catalogued log class, generated from ``pipelines/catalogue.py``.

- **Ingest pipeline** (``pipelines/ingest/<class>.json``): the envelope and events grok processors, the
  date processors and the classify script's parameters are rewritten in place (found by their tags); the
  hand-written painless around them (the envelope script's fast path) stays.
- **Edge** (``pipelines/edge/``): the liblognorm rulebases ``<class>-envelope.rb`` and
  ``<class>-events.rb`` (rsyslog ``mmnormalize``), the Xid lookup tables, and the RainerScript ruleset
  (``edge_ruleset``) that turns their result into the same ECS document the ingest pipeline makes.

``fleetsight logs generate`` writes them; ``--check`` (CI) fails when a file differs from the catalogue.
This module lists and writes the files; each family has its own module: ``patterns`` (a catalogue
pattern as grok, liblognorm and POSIX regex), ``ingest_pipeline``, and for the edge ``edge`` (the
ruleset's assembly) with ``edge_times``, ``edge_classify`` and ``rainerscript`` (shared blocks).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..catalogue import CATALOGUES
from .edge import xid_table
from .ingest_pipeline import ingest_pipeline, with_ingest_time
from .patterns import lognorm_rulebase, lower_events, main_events

PIPELINES_DIR = Path(__file__).resolve().parent.parent
INGEST_DIR = PIPELINES_DIR / "ingest"
EDGE_DIR = PIPELINES_DIR / "edge"


def generated_files() -> dict[Path, str]:
    """Every generated file and the text it must have."""
    files: dict[Path, str] = {}
    for path in sorted(INGEST_DIR.glob("*.json")):
        files[path] = (
            json.dumps(with_ingest_time(json.loads(path.read_text())), indent=2, ensure_ascii=False) + "\n"
        )
    for catalogue in CATALOGUES.values():
        path = INGEST_DIR / f"{catalogue.log_class}.json"
        pipeline = ingest_pipeline(catalogue, json.loads(path.read_text()))
        files[path] = json.dumps(pipeline, indent=2, ensure_ascii=False) + "\n"
        name = catalogue.log_class
        if catalogue.edge_engine == "regex":
            continue
        files[EDGE_DIR / f"{name}-envelope.rb"] = lognorm_rulebase(
            catalogue.envelopes, f"{name} log envelopes"
        )
        if catalogue.events:
            files[EDGE_DIR / f"{name}-events.rb"] = lognorm_rulebase(
                main_events(catalogue), f"{name} log events"
            )
        if lower_events(catalogue):
            files[EDGE_DIR / f"{name}-events-lower.rb"] = lognorm_rulebase(
                lower_events(catalogue), f"{name} log events, matched in lower case"
            )
    for what in ("category", "action"):
        files[EDGE_DIR / f"xid_{what}.json"] = xid_table(what)
    return files


def stale() -> list[Path]:
    return [path for path, text in generated_files().items() if not path.exists() or path.read_text() != text]


def write() -> list[Path]:
    changed = stale()
    files = generated_files()
    EDGE_DIR.mkdir(exist_ok=True)
    for path in changed:
        path.write_text(files[path])
    return changed
