"""The Xid lookup inside the kernel log's ingest pipeline, generated from the shared catalogue.

``fleetsight/xid_catalog.py`` is the one source of each Xid's category and recommended action (the node
agent uses it too). The kernel pipeline (``pipelines/ingest/kernel.json``) carries a copy as the
``params`` of its ``xid_classify`` script processor, because an ingest pipeline cannot import Python.
``fleetsight logs generate`` rewrites that copy; a test fails when the two differ.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleetsight import xid_catalog

KERNEL_PIPELINE = Path(__file__).resolve().parent / "ingest" / "kernel.json"
SCRIPT_TAG = "xid_classify"


def catalog_params() -> dict[str, Any]:
    """The catalogue as the script's params: code (as a string: painless map keys) -> category, action."""
    return {
        "xid_catalog": {
            str(code): {"category": info.category, "action": info.action}
            for code, info in sorted(xid_catalog.CATALOG.items())
        },
        "xid_unknown": {"category": xid_catalog.UNKNOWN.category, "action": xid_catalog.UNKNOWN.action},
    }


def classify_processor(pipeline: dict[str, Any]) -> dict[str, Any]:
    """The script processor that carries the lookup (found by its tag)."""
    for processor in pipeline["processors"]:
        script = processor.get("script")
        if script and script.get("tag") == SCRIPT_TAG:
            return script
    raise ValueError(f"no script processor tagged {SCRIPT_TAG!r} in the kernel pipeline")


def embedded_params(path: Path = KERNEL_PIPELINE) -> dict[str, Any]:
    params = classify_processor(json.loads(path.read_text()))["params"]
    return {key: params[key] for key in ("xid_catalog", "xid_unknown") if key in params}


def write_catalog(path: Path = KERNEL_PIPELINE) -> bool:
    """Rewrite the lookup in the kernel pipeline from the catalogue; True when the file changed."""
    text = path.read_text()
    pipeline = json.loads(text)
    classify_processor(pipeline)["params"].update(catalog_params())
    new_text = json.dumps(pipeline, indent=2, ensure_ascii=False) + "\n"
    if new_text == text:
        return False
    path.write_text(new_text)
    return True
