"""The training watch's window between cycles (anomaly/sdc_window.py), its pure parts: which documents stay
in the window, when a job must be read whole, the store's order. The reads themselves run against a real
OpenSearch in tests/anomaly/test_sdc_log_store.py."""

from __future__ import annotations

from typing import Any

import pytest

from anomaly.sdc_window import in_store_order, in_window, newest_ingested, unix


def doc(
    step: Any, at: str, host: str = "n1", ingested: str | None = "2026-11-21T10:05:00.000Z"
) -> dict[str, Any]:
    event = {"action": "training_progress"} | ({"ingested": ingested} if ingested else {})
    return {"@timestamp": at, "host": {"name": host}, "event": event, "training": {"step": step}}


def test_dates_read_as_the_store_writes_them() -> None:
    assert unix("2026-11-21T10:00:00.000Z") == pytest.approx(1795255200.0)
    assert unix("2026-11-21T10:00:00Z") == unix("2026-11-21T10:00:00+00:00") == unix(1795255200000)
    assert unix("yesterday") is None and unix(None) is None and unix("") is None


def test_documents_that_left_the_window_go_and_unreadable_times_stay() -> None:
    kept = in_window(
        {"a": doc(1, "2026-11-21T09:59:59.000Z"), "b": doc(2, "2026-11-21T10:00:00.000Z"), "c": doc(3, "?")},
        unix("2026-11-21T10:00:00Z") or 0.0,
    )
    assert sorted(kept) == ["b", "c"]


def test_one_document_without_event_ingested_makes_the_job_read_whole() -> None:
    late = doc(2, "2026-11-21T10:00:01Z", ingested="2026-11-21T10:07:00.000Z")
    assert newest_ingested([doc(1, "2026-11-21T10:00:00Z"), late]) == unix("2026-11-21T10:07:00Z")
    assert newest_ingested([late, doc(3, "2026-11-21T10:00:02Z", ingested=None)]) is None
    assert newest_ingested([]) is None


def test_the_store_order_is_step_then_time_then_host_with_unreadable_steps_last() -> None:
    documents = [
        doc(2, "2026-11-21T10:00:00Z", "n2"),
        doc("10", "2026-11-21T10:00:09Z"),
        doc(2, "2026-11-21T10:00:00Z", "n1"),
        doc(None, "2026-11-21T10:00:00Z"),
        doc(1, "2026-11-21T10:00:05Z"),
        doc(1, "2026-11-21T10:00:03Z"),
    ]
    order = [
        (d["training"]["step"], d["@timestamp"][-3:-1], d["host"]["name"]) for d in in_store_order(documents)
    ]
    assert order == [(1, "03", "n1"), (1, "05", "n1"), (2, "00", "n1"), (2, "00", "n2"), ("10", "09", "n1"),
                     (None, "00", "n1")]  # fmt: skip
