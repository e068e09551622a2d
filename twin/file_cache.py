"""Writing the twin's files cheaply and safely: a cache of what each file holds, so that a file is
written only when its content changes.

On a disk file system every file written costs: a new inode or a rename is ~100 us of kernel time on
ext4 and every changed file dirties a page that must go to disk. So a file is written only when its
content changes (a node has ~860 files, ~80 of which change in a tick: the busy IB counters and the
Lustre stats), and the IB counters are compared as numbers before any string is formatted. How a
changed file is written depends on what a reader may see:

- single-value sysfs files (counters, state, link speed) grow in place with one ``pwrite``: a reader's
  one small read sees the old or the new value, never an empty file;
- multi-line files (Lustre ``stats``, ``rpc_stats``, ``import``, the servers' ``job_stats``, the
  probe's JSON), new files and
  values that shrink (a counter reset by a reboot) go through a temporary file and a rename, so a
  reader never sees half of one and half of another.

Its own module because every file family (the sysfs tree, the Lustre client's procfs files, the
probe's JSON, the Lustre servers') writes through it, and the write strategy changes on its own.
"""

from __future__ import annotations

import os
from pathlib import Path


class FileCache:
    """Remembers what each file holds so that unchanged files are not rewritten."""

    def __init__(self) -> None:
        self.content: dict[str, str] = {}
        self.writes = 0
        self.renames = 0

    def put(self, path: str, text: str, atomic: bool = False) -> None:
        """Write text to path unless it holds it already; atomic: always replace by rename."""
        old = self.content.get(path)
        if old == text:
            return
        if old is None:
            old = read_existing(path)  # a restart into the same folder keeps what is still right
            if old == text:
                self.content[path] = text
                return
        data = text.encode()
        if atomic or old is None or len(text) < len(old):
            tmp = f"{path}.tmp"
            with open(tmp, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
            self.renames += 1
        else:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.pwrite(fd, data, 0)
            finally:
                os.close(fd)
        self.content[path] = text
        self.writes += 1

    def forget(self, path: str) -> None:
        self.content.pop(path, None)


def read_existing(path: str) -> str | None:
    """What a file left by an earlier run holds (None if there is none or it is not text)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 20).decode()
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def write_static(cache: FileCache, directory: Path, **files: str) -> None:
    """Files that never change after the tree is made, one value and a newline each."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        cache.put(str(directory / name), f"{value}\n")
