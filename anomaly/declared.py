"""What a job's submitter declares about it, read from the scheduler and the pod: today, whether the job
routes experts (a MoE job's load moves between its nodes by design; anomaly/jobs.py says where from).
Its own module: anomaly/jobs.py and anomaly/owners.py both read it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# A job that declares its expert routing: a pod label (value true/yes/1) and a Slurm comment's word.
ROUTING_POD_LABEL = "fleetsight.io/expert-routing"
ROUTING_COMMENT_ENV = "FLEETSIGHT_ROUTING_COMMENT"
DEFAULT_ROUTING_COMMENT = r"(?<![\w-])expert-routing(?![\w-])"
_TRUE_WORDS = frozenset({"true", "yes", "1", "on"})

_INVALID_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")


def sanitize_label_name(key: str) -> str:
    """A pod label key as dcgm-exporter's utils.SanitizeLabelName writes it."""
    return _INVALID_LABEL_CHARS.sub("_", key)


def declares_routing(labels: Mapping[str, str], sanitised: bool = True) -> bool:
    """Whether a pod's labels (as dcgm-exporter writes them, or as the API server gives them) declare
    expert routing."""
    key = sanitize_label_name(ROUTING_POD_LABEL) if sanitised else ROUTING_POD_LABEL
    return str(labels.get(key) or "").strip().lower() in _TRUE_WORDS


def routing_comment_pattern(text: str | None = None) -> re.Pattern[str]:
    """The pattern a Slurm job's comment matches to declare expert routing (case-insensitive):
    ``text``, else ``FLEETSIGHT_ROUTING_COMMENT``, else the word ``expert-routing``."""
    raw = text if text is not None else os.environ.get(ROUTING_COMMENT_ENV, "")
    try:
        return re.compile(raw.strip() or DEFAULT_ROUTING_COMMENT, re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"{ROUTING_COMMENT_ENV}: not a regular expression: {raw!r} ({exc})") from exc
