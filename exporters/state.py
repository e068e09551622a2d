"""Where the node agent keeps what must survive a restart (the kernel log position and the Xid counts).

The default is chosen so that an agent started with no flags is restart-safe:

1. ``$STATE_DIRECTORY`` (systemd sets it for a unit with ``StateDirectory=``; the first of a
   colon-separated list);
2. ``/var/lib/fleetsight/node-agent`` when it is, or can be made, writable (a root daemon);
3. ``$XDG_STATE_HOME/fleetsight/node-agent``, else ``~/.local/state/fleetsight/node-agent`` (a user).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

SYSTEM_STATE_DIR = "/var/lib/fleetsight/node-agent"


def can_create(path: str) -> bool:
    """True when ``path`` is a writable folder, or could be created as one (its nearest existing
    ancestor is a writable folder); creates nothing."""
    probe = Path(path).absolute()
    while not probe.exists():
        if probe.parent == probe:
            return False
        probe = probe.parent
    return probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)


def default_state_dir(
    environ: Mapping[str, str] | None = None, system_dir: str = SYSTEM_STATE_DIR
) -> tuple[str, str]:
    """``(folder, origin)``: the state folder to use when ``--state-dir`` is not given, and which rule
    chose it (``STATE_DIRECTORY``, ``system``, ``XDG_STATE_HOME``, ``home``)."""
    env = os.environ if environ is None else environ
    systemd = env.get("STATE_DIRECTORY", "").split(":")[0]
    if systemd:
        return systemd, "STATE_DIRECTORY"
    if can_create(system_dir):
        return system_dir, "system"
    xdg = env.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg):  # the XDG spec says to ignore a relative path
        return os.path.join(xdg, "fleetsight", "node-agent"), "XDG_STATE_HOME"
    home = env.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".local", "state", "fleetsight", "node-agent"), "home"


def check_writable(folder: str) -> str | None:
    """None when a file can be written in ``folder`` (created if needed), else why not."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def save_json(path: str, data: object) -> None:
    """Writes ``data`` to ``path`` atomically and durably: a temporary file in the same folder, flushed
    to disk, then renamed over the old one. A crash leaves the old file or the new one, never half of
    one (a half-written state would make a restarted agent count the whole log again)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
