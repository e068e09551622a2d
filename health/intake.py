"""Events in: Alertmanager's webhook and the anomaly service's straggler flags and clears
(``POST /v1/events/...``, scope ``events``), checked, turned into signals by the sources' rules, queued on
the service and answered at once; the service's worker decides them in batches.

A module of its own: the webhook bodies are other programs' formats (Alertmanager's version 4, the
anomaly service's events) and change with them, not with the decision logic or the read API.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel, Field

from .service_protocol import Service

# fleetsight_health_event_delay_seconds: receipt of an event -> its decision published
DELAY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class WebhookAlert(BaseModel):
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str | None = None  # Alertmanager's field names
    endsAt: str | None = None
    fingerprint: str | None = None


class AlertmanagerNotification(BaseModel):
    """Alertmanager's webhook body (version 4); the fields the service reads are checked."""

    version: str
    status: str
    receiver: str = ""
    groupKey: str = ""
    alerts: list[WebhookAlert] = Field(max_length=100000)


class AnomalyEvent(BaseModel):
    event: Literal["flag", "clear"]
    node: str = Field(min_length=1)
    hpc_job: str = ""
    cause: str = ""
    score: float = 1.0
    since: str | None = None


class AnomalyEvents(BaseModel):
    events: list[AnomalyEvent] = Field(min_length=1, max_length=100000)


def add_event_routes(app: FastAPI, service: Service, require_events: Any) -> None:
    """Alertmanager's webhook and the anomaly service's flags and clears (scope ``events``): queued and
    answered at once; the worker decides them in batches."""

    @app.post(
        "/v1/events/alertmanager",
        summary="Alertmanager webhook receiver (scope: events)",
        status_code=202,
        dependencies=[Depends(require_events)],
    )
    def alertmanager_events(body: AlertmanagerNotification) -> dict[str, Any]:
        if body.version != "4":
            raise HTTPException(422, f"webhook version {body.version!r}: version 4 is read")
        now = time.time()
        items = []
        for alert in body.alerts:
            signal = service.sources.alert_signal(alert.model_dump(), now)
            if signal is not None:  # an alert with no node label says nothing about a node
                items.append((signal, alert.status == "firing"))
        service.receive("alertmanager", items)
        return {"accepted": len(items), "ignored": len(body.alerts) - len(items)}

    @app.post(
        "/v1/events/anomaly",
        summary="The anomaly service's straggler flags and clears (scope: events)",
        status_code=202,
        dependencies=[Depends(require_events)],
    )
    def anomaly_events(body: AnomalyEvents) -> dict[str, Any]:
        now = time.time()
        items = []
        for event in body.events:
            signal = service.sources.straggler_event(event.model_dump(), now)
            if signal is not None:
                items.append((signal, event.event == "flag"))
        service.receive("anomaly", items)
        return {"accepted": len(items)}
