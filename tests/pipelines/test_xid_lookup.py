"""The kernel pipeline's Xid category/action come from fleetsight/xid_catalog.py: one source."""

from __future__ import annotations

import subprocess

import httpx
from logs_helpers import LogStack

from fleetsight import xid_catalog
from pipelines.logclasses import BY_NAME
from pipelines.xid_lookup import catalog_params, embedded_params
from support import FLEETSIGHT, REPO_ROOT


def test_kernel_pipeline_carries_the_catalogue() -> None:
    assert embedded_params() == catalog_params(), "run `fleetsight logs generate`"


def test_generate_check_agrees() -> None:
    result = subprocess.run(
        [*FLEETSIGHT, "logs", "generate", "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "up to date" in result.stdout


def test_every_catalogued_code_gets_its_category_and_action(log_stack: LogStack) -> None:
    codes = sorted(xid_catalog.CATALOG)
    docs = [
        {
            "_source": {
                "message": f"[ 99.000001] NVRM: Xid (PCI:0000:1b:00): {code}, pid=7, name=python3, text"
            }
        }
        for code in codes
    ]
    pipeline = BY_NAME["kernel"].pipeline_id
    response = httpx.post(
        f"{log_stack.search_url}/_ingest/pipeline/{pipeline}/_simulate", json={"docs": docs}
    )
    assert response.status_code == 200, response.text
    for code, result in zip(codes, response.json()["docs"], strict=True):
        xid = result["doc"]["_source"]["nvidia"]["xid"]
        info = xid_catalog.lookup(code)
        assert (xid["code"], xid["category"], xid["action"]) == (code, info.category, info.action)
