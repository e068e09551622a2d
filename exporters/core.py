"""What every FleetSight exporter shares: its logging, cheap file reads, and the contract of a source.

A collector implements :meth:`Source.gather`, which returns metric families and records problems in a
:class:`Problems` list instead of raising; the node agent's collectors register themselves with
:func:`register_collector`. The runners that drive sources are in :mod:`.runners`, the families and the
renderer of the exposition format in :mod:`.exposition`.
"""

from __future__ import annotations

import logging
import os
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric


def configure_logging(level: str = "INFO") -> None:
    """Structured logs: one event per line, key=value, on stderr (stdout carries ``--once`` output)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"))
    root = logging.getLogger("fleetsight")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def kv(**fields: object) -> str:
    """key=value pairs, quoting values that contain spaces (log lines stay one event per line)."""
    parts = []
    for key, value in fields.items():
        text = str(value).replace("\n", "\\n")
        parts.append(f'{key}="{text}"' if (" " in text or "=" in text or not text) else f"{key}={text}")
    return " ".join(parts)


def tls_verify(verify: bool | str) -> bool | ssl.SSLContext:
    """httpx's ``verify``: True/False, or a context trusting the CA bundle at a path."""
    return ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify


# -- file reads ------------------------------------------------------------------------------------


def read_text(path: str, limit: int = 1 << 20) -> str | None:
    """The content of a small (sysfs/procfs) file, or None when it cannot be read.

    ``os.open``/``os.read`` costs about half of ``open().read()`` on the thousand tiny files a node
    scrape touches. procfs hands a file over in page-sized reads: read until a read comes back empty
    (or ``limit`` bytes).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 65536)
        if len(data) < 4096:  # sysfs attributes and small stats files: one read is the whole file
            return data.decode("utf-8", "replace")
        chunks = [data]
        total = len(data)
        while total < limit:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def list_dir(path: str) -> list[str]:
    """Sorted names in a folder; an absent or unreadable folder is empty."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


# -- problems and sources --------------------------------------------------------------------------


@dataclass
class Problems:
    """Errors a collector met in one scrape, by source (``sysfs``, ``redfish``, ``kern_log``...)."""

    by_source: dict[str, int] = field(default_factory=dict)
    first: str = ""

    def add(self, source: str, detail: str) -> None:
        self.by_source[source] = self.by_source.get(source, 0) + 1
        if not self.first:
            self.first = f"{source}: {detail}"

    def merge(self, other: Problems, count: bool = True) -> None:
        """Adds another list's problems; ``count=False`` keeps the failure without counting it again."""
        for source, n in other.by_source.items():
            self.by_source[source] = self.by_source.get(source, 0) + (n if count else 0)
        self.first = self.first or other.first

    def __bool__(self) -> bool:
        return bool(self.by_source)


class Source:
    """One collector of the node agent or the fabric exporter: ``gather`` returns metric families and
    records what went wrong in ``problems`` instead of raising."""

    name = "source"
    error_sources: tuple[str, ...] = ()
    """Where its errors can come from (``ufm``...): their ``errors_total`` starts at 0, so that
    ``increase()`` sees the first error (a counter that appears at 1 shows no increase)."""

    def gather(self, problems: Problems) -> list[Metric]:
        raise NotImplementedError

    def close(self) -> None:
        """Releases what the source holds open (files, subprocesses)."""


# The node agent's collectors register themselves here (node_exporter's registerCollector is the model):
# name -> (position in the output, factory). A factory gets the agent's options and the node's GPU map
# and returns its source, or None when the source is not configured on this host (no BMC URL...).
CollectorFactory = Callable[[Any, Any], "Source | None"]
_COLLECTORS: dict[str, tuple[int, CollectorFactory]] = {}


def register_collector(name: str, position: int) -> Callable[[CollectorFactory], CollectorFactory]:
    """Declare a collector of the node agent; ``--collector NAME`` enables it by this name."""

    def register(factory: CollectorFactory) -> CollectorFactory:
        if name in _COLLECTORS:
            raise ValueError(f"collector {name!r} is registered twice")
        _COLLECTORS[name] = (position, factory)
        return factory

    return register


def collectors() -> dict[str, CollectorFactory]:
    """The registered collectors, in their output order."""
    return {name: factory for name, (_, factory) in sorted(_COLLECTORS.items(), key=lambda kv: kv[1][0])}
