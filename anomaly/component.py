"""The anomaly service in the local stack: reads the stack's Prometheus and the twin's slurmrestd jobs,
serves /metrics (scraped as job "anomaly", which the StragglerNode alert reads) and /v1/stragglers; and
the silent-corruption watch over the training logs in the stack's OpenSearch (anomaly/sdc_watch.py,
scraped as job "training-sdc", which TrainingSilentCorruptionSuspected reads)."""

from __future__ import annotations

import os

from fleetsight.components import Component, fleetsight_command, http_ok, scrape_own_port
from fleetsight.settings import Settings


def env(settings: Settings) -> dict[str, str]:
    """Flags and clears pushed to the stack's health service (anomaly/notify.py), with the token the
    Alertmanager pair's webhook uses (written by alerting/component.py before the pair starts)."""
    folder = os.environ.get("FLEETSIGHT_ALERTMANAGER_SECRETS_DIR")
    secrets = os.path.expanduser(folder) if folder else str(settings.config_dir("alertmanager"))
    return {
        "FLEETSIGHT_ANOMALY_HEALTH_URL": settings.url("health"),
        "FLEETSIGHT_ANOMALY_HEALTH_TOKEN_FILE": os.path.join(secrets, "health_events_token"),
    }


def command(settings: Settings) -> list[str]:
    """On a Slurm-shaped twin the jobs come from its slurmrestd; on a Kubernetes-shaped one (no Slurm)
    from the pod labels dcgm-exporter puts on the GPUs, as on a real Kubernetes cluster."""
    slurm = settings.scheduler == "slurm"
    jobs = ["--slurm-url", settings.url("twin", "/slurm/v0.0.40/jobs")] if slurm else []
    return fleetsight_command(
        "anomaly",
        "serve",
        "--prometheus-url",
        settings.url("prometheus"),
        *jobs,
        "--listen",
        f"{settings.host}:{settings.port('anomaly')}",
        # What the twin's samples average: 1 s (realism.sample_window) unless a scenario says otherwise,
        # where the fast path stays off (docs/anomaly.md, "Sampling cadence").
        "--dcgm-interval",
        os.environ.get("FLEETSIGHT_DCGM_INTERVAL") or "1s",
    )


def sdc_command(settings: Settings) -> list[str]:
    """Every 60 s over the last 6 h of steps: the twin's scenarios run for hours, not days."""
    return fleetsight_command(
        "anomaly",
        "sdc",
        "serve",
        "--logs-url",
        settings.url("opensearch"),
        "--interval",
        "60",
        "--listen",
        f"{settings.host}:{settings.port('training_sdc')}",
    )


COMPONENTS = [
    Component(
        name="anomaly",
        description="Anomaly service: straggler nodes of running jobs with cause and evidence",
        command=command,
        env=env,
        ready=lambda s: http_ok(s.url("anomaly", "/healthz")),
        urls=lambda s: {
            "stragglers": s.url("anomaly", "/v1/stragglers"),
            "api docs": s.url("anomaly", "/docs"),
            "metrics": s.url("anomaly", "/metrics"),
        },
        scrape_configs=scrape_own_port("anomaly", "anomaly"),
        # It reads Prometheus and the twin's jobs every cycle: started before them, its first cycles
        # only report the source down.
        depends_on=("prometheus", "twin"),
        ready_timeout_s=60.0,
    ),
]

COMPONENTS.append(
    Component(
        name="training-sdc",
        description="Silent data corruption: training jobs whose updates turn wrong, from their logs",
        command=sdc_command,
        ready=lambda s: http_ok(s.url("training_sdc", "/metrics")),
        urls=lambda s: {"metrics": s.url("training_sdc", "/metrics")},
        scrape_configs=scrape_own_port("training-sdc", "training_sdc"),
        # Reads the training lines the log pipeline indexes; until OpenSearch answers it reports the
        # store down (fleetsight_training_sdc_source_up 0) and keeps trying.
        depends_on=("opensearch",),
        ready_timeout_s=30.0,
    )
)

PORTS = {"anomaly": 140, "training_sdc": 149}
CLI = {"anomaly": (".cli", "straggler detection: serve it, replay it over Prometheus history")}
