"""One writer per state directory: two health services started on the same state (a second bare-metal
instance by mistake, a unit started twice, a standby host mounting the same directory) would each decide
and drain on their own and overwrite each other's file. The first one holds an exclusive lock on
``<state dir>/writer.lock`` for its whole life; the kernel lets it go when the process ends, however it
ends, so a crash never leaves a stale lock. (Two replicas on Kubernetes each have their own directory
and one writer by the Lease: health/leader.py.)"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import IO

LOCK_NAME = "writer.lock"


class StateLocked(RuntimeError):
    """Another process holds the state directory; the message names it."""


def hold(state_dir: Path) -> IO[str]:
    """Take the state directory's writer lock, or raise :class:`StateLocked`. Keep the returned file
    open for as long as this process writes the state."""
    state_dir.mkdir(parents=True, exist_ok=True)
    handle = (state_dir / LOCK_NAME).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise StateLocked(
            f"state directory {state_dir} is held by {holder}: another health service writes it "
            "(stop it, or give this one its own --state-dir)"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    return handle
