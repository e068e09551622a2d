"""Reading the kernel log incrementally, from ``/dev/kmsg``, a syslog file, or journald.

Each reader returns the lines that appeared since the last call, with the time the kernel logged them
when the source says so, and a *position* (file inode and offset; kmsg boot id and sequence number;
journald cursor) that the caller persists, so that a restarted agent does not count old lines again.
A file reader notices rotation (a new inode at the path: it finishes the old file, then starts the new
one at offset 0; after a restart it finds the saved file among the rotated copies, ``<path>.1``,
``<path>.2``, ``<path>.2.gz`` ..., by the bytes before the saved offset, and reads it and every newer
copy before the log) and truncation (size below the offset, or the bytes
before the offset changed).
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import re
import stat
import subprocess
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from datetime import datetime

MAX_BYTES_PER_POLL = 8 << 20  # bounds one scrape's work after a long outage; the rest comes next time
TAIL_BYTES = 1024  # enough to span a whole kernel line, timestamp included

_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s")


@dataclass
class LogLine:
    text: str
    timestamp: float | None = None  # unix seconds when the source says when; else None


def syslog_timestamp(line: str) -> float | None:
    """Unix time of a line that starts with an RFC 3339 stamp (rsyslog's file format), else None."""
    match = _RFC3339.match(line)
    if not match:
        return None
    stamp = match.group(1).replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo else None


class FileReader:
    """Tails a kernel log file (``/var/log/kern.log`` style), surviving rotation and truncation."""

    kind = "file"

    def __init__(self, path: str, position: dict | None = None) -> None:
        self.path = path
        self.fd: int | None = None
        self.data: bytes | None = None  # a compressed rotated file, read whole (it no longer grows)
        self.inode: int | None = None
        self.offset = 0
        self.partial = b""
        # The last bytes read before ``offset``: if they change, the file was truncated and rewritten
        # to at least the same size between two polls (copytruncate), and is read again from the top.
        self.tail = b""
        # Rotated files newer than the one being finished, oldest first: read whole, in turn, before
        # the file at ``path`` (logrotate ran more than once while the agent was down).
        self.backlog: list[str] = []
        # Restored from a saved position: the first open looks for the saved file among the rotated
        # ones too, so that lines written to it between the last save and the rotation are not lost.
        self.restored = False
        if position and position.get("kind") == self.kind and position.get("path") == path:
            self.inode, self.offset = position.get("inode"), int(position.get("offset", 0))
            self.restored = self.inode is not None
            try:
                self.tail = bytes.fromhex(str(position.get("tail", "")))
            except ValueError:
                self.tail = b""

    def position(self) -> dict:
        """Where the next line starts: the offset of a partial (unfinished) line is not saved, so that a
        restarted agent reads that line whole once it is complete."""
        keep = len(self.partial)
        return {
            "kind": self.kind,
            "path": self.path,
            "inode": self.inode,
            "offset": self.offset - keep,
            "tail": (self.tail[:-keep] if keep else self.tail).hex(),
        }

    @property
    def is_open(self) -> bool:
        return self.fd is not None or self.data is not None

    def _open(self) -> bool:
        try:
            fd: int | None = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            fd = None
        inode = os.fstat(fd).st_ino if fd is not None else None
        restored, self.restored = self.restored, False
        # The saved file is elsewhere when the log has another inode, or the same inode number with
        # other bytes (the number was freed by a rotation and reused for the new log).
        moved = inode != self.inode or (fd is not None and not self._same_bytes(fd))
        if restored and moved and self._open_rotated():
            if fd is not None:
                os.close(fd)
            return True
        if fd is None:
            return False
        if inode != self.inode:  # a different file than the saved position names: start at its top
            self.inode, self.offset, self.partial, self.tail = inode, 0, b"", b""
        self.fd = fd
        return True

    def _same_bytes(self, fd: int) -> bool:
        """True when the open file holds the saved tail just before the saved offset."""
        if not self.tail:
            return os.fstat(fd).st_size >= self.offset
        start = self.offset - len(self.tail)
        return start >= 0 and os.pread(fd, len(self.tail), start) == self.tail

    def rotated_files(self) -> list[str]:
        """The rotated copies of the log next to it, newest first: ``kern.log.1``, ``kern.log.2.gz``
        (numbered), ``kern.log-20261121`` (dateext)."""
        folder, base = os.path.split(os.path.abspath(self.path))
        found = []
        for name in os.listdir(folder or "."):
            if name != base and (name.startswith(base + ".") or name.startswith(base + "-")):
                full = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    found.append((os.stat(full).st_mtime_ns, _rotation_number(name, base), full))
        # Numbered copies by their number (compression changes a copy's mtime), the others (dateext)
        # newest first.
        found.sort(key=lambda item: (item[1], -item[0]))
        return [full for _, _, full in found]

    def _open_rotated(self) -> bool:
        """Finds the file the saved position names among the rotated ones (logrotate renamed, copied
        or compressed it while the agent was down, maybe more than once). :meth:`poll` finishes it,
        then the newer rotated files, then the log."""
        try:
            candidates = self.rotated_files()
        except OSError:
            return False
        for index, candidate in enumerate(candidates):
            if self._matches(candidate):
                self.backlog = list(reversed(candidates[:index]))
                return True
        return False

    def _matches(self, candidate: str) -> bool:
        """Opens ``candidate`` when it holds the saved file: the saved bytes just before the saved
        offset (a renamed file, one compressed since, or a copytruncate copy), or, with no bytes to
        compare, the saved inode."""
        if not self.tail:
            if _inode(candidate) != self.inode:
                return False
        elif not self._holds_tail(candidate):
            return False
        if candidate.endswith(".gz"):
            self.data = _gunzip(candidate, None)
            if self.data is None:
                return False
        else:
            try:
                self.fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return False
        self.inode = _inode(candidate)  # what a restart in the middle of this file looks for
        return True

    def _holds_tail(self, candidate: str) -> bool:
        start = self.offset - len(self.tail)
        if candidate.endswith(".gz"):
            head = _gunzip(candidate, self.offset)
            return head is not None and head[start : self.offset] == self.tail
        try:
            with open(candidate, "rb") as f:
                f.seek(start)
                return f.read(len(self.tail)) == self.tail
        except OSError:
            return False

    def _size(self) -> int:
        return len(self.data) if self.data is not None else os.fstat(self.fd).st_size  # type: ignore[arg-type]

    def _pread(self, length: int, offset: int) -> bytes:
        if self.data is not None:
            return self.data[offset : offset + length]
        return os.pread(self.fd, length, offset)  # type: ignore[arg-type]

    def _read_available(self, budget: int) -> bytes:
        size = self._size()
        if size < self.offset or (
            self.tail and self._pread(len(self.tail), self.offset - len(self.tail)) != self.tail
        ):
            self.offset, self.partial, self.tail = 0, b"", b""  # truncated in place (copytruncate)
        if size == self.offset:
            return b""
        data = self._pread(min(size - self.offset, budget), self.offset)
        self.offset += len(data)
        self.tail = (self.tail + data)[-TAIL_BYTES:]
        return data

    def poll(self) -> list[LogLine]:
        if not self.is_open and not self._open():
            raise FileNotFoundError(f"kernel log {self.path} cannot be opened")
        budget = MAX_BYTES_PER_POLL
        lines: list[LogLine] = []
        while True:
            data = self._read_available(budget)
            budget -= len(data)
            if budget <= 0 or not self._finished_file():
                return lines + self._split(data, final=False)
            # This file was rotated away and is drained: on to the next one.
            lines += self._split(data, final=True)
            self.close()
            if not self._open_next():
                return lines

    def _finished_file(self) -> bool:
        """True when the open file is no longer the log at ``path`` (it was rotated)."""
        if self.data is not None or self.backlog:
            return True
        try:
            return os.stat(self.path).st_ino != self.inode
        except OSError:
            return False  # renamed away and not recreated yet: keep reading the old one

    def _open_next(self) -> bool:
        """Opens the next rotated file of the backlog from its top, else the log at ``path``."""
        self.offset, self.partial, self.tail = 0, b"", b""
        while self.backlog:
            candidate = self.backlog.pop(0)
            if candidate.endswith(".gz"):
                self.data = _gunzip(candidate, None)
                if self.data is not None:
                    self.inode = _inode(candidate)
                    return True
                continue
            try:
                self.fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            self.inode = os.fstat(self.fd).st_ino
            return True
        self.inode = None
        return self._open()

    def _split(self, data: bytes, final: bool) -> list[LogLine]:
        if not data and not (final and self.partial):
            return []
        data = self.partial + data
        pieces = data.split(b"\n")
        self.partial = b"" if final else pieces.pop()
        lines = []
        for raw in pieces:
            if raw:
                text = raw.decode("utf-8", "replace")
                lines.append(LogLine(text, syslog_timestamp(text)))
        return lines

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.data = None


def _rotation_number(name: str, base: str) -> int:
    """1 for ``kern.log.1`` and ``kern.log.1.gz``; a big number for names without one."""
    rest = name[len(base) + 1 :].split(".", 1)[0]
    return int(rest) if rest.isdigit() and len(rest) < 6 else 1 << 30


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _gunzip(path: str, limit: int | None) -> bytes | None:
    """The first ``limit`` bytes (all, for None) of a gzip file, or None when it cannot be read."""
    try:
        with gzip.open(path, "rb") as f:
            return f.read() if limit is None else f.read(limit)
    except (OSError, EOFError, zlib.error):
        return None


def parse_kmsg_record(record: bytes) -> tuple[int, int, str] | None:
    """``(sequence, microseconds since boot, message)`` from one ``/dev/kmsg`` record:
    ``"6,1234,5678901,-;NVRM: Xid ...\\n SUBSYSTEM=pci\\n"`` (continuation lines start with a space)."""
    head, sep, rest = record.partition(b";")
    if not sep:
        return None
    fields = head.split(b",")
    if len(fields) < 4:
        return None
    try:
        seq, usec = int(fields[1]), int(fields[2])
    except ValueError:
        return None
    message = rest.split(b"\n", 1)[0].decode("utf-8", "replace")
    return seq, usec, message


def boot_time(procfs_root: str) -> float:
    """Unix time of boot (``btime`` in /proc/stat), to date kmsg records."""
    try:
        with open(os.path.join(procfs_root, "stat")) as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return time.time() - time.monotonic()


def boot_id(procfs_root: str) -> str:
    try:
        with open(os.path.join(procfs_root, "sys", "kernel", "random", "boot_id")) as f:
            return f.read().strip()
    except OSError:
        return ""


class KmsgReader:
    """Reads ``/dev/kmsg`` without blocking: one record per read(), until EAGAIN.

    Opening ``/dev/kmsg`` starts at the oldest record the ring buffer still holds, so a restarted agent
    sees records it has counted before: the saved sequence number (valid for the saved boot id only)
    says which. A regular file of kmsg records (a saved ``/dev/kmsg`` dump, a test) is read the same
    way: from its top on start, records at or below the saved sequence number skipped.
    """

    kind = "kmsg"

    def __init__(self, path: str = "/dev/kmsg", procfs_root: str = "/proc", position: dict | None = None):
        self.path = path
        self.boot = boot_id(procfs_root)
        self.btime = boot_time(procfs_root)
        self.seq = -1
        self.fd: int | None = None
        self.regular = False
        self.partial = b""
        # Without a boot id, a reboot shows as sequence numbers that went back: records at or below the
        # saved number are held until the buffer is read to its end, and counted if nothing newer came.
        self.held: list[tuple[int, LogLine]] | None = None
        self.saved_seq = -1
        if position and position.get("kind") == self.kind and position.get("boot_id") == self.boot:
            self.seq = self.saved_seq = int(position.get("seq", -1))  # same boot: skip what was counted
            self.held = [] if not self.boot and self.seq >= 0 else None

    def position(self) -> dict:
        return {"kind": self.kind, "path": self.path, "boot_id": self.boot, "seq": self.seq}

    def _records(self) -> tuple[list[bytes], bool]:
        """Records read in this poll (at most MAX_BYTES_PER_POLL), and whether the end was reached."""
        assert self.fd is not None
        if self.regular:
            data = os.read(self.fd, MAX_BYTES_PER_POLL)
            pieces = (self.partial + data).split(b"\n")
            self.partial = pieces.pop()
            # Continuation lines (" SUBSYSTEM=pci") start with a space; the message is the first line.
            return [p for p in pieces if p and not p.startswith(b" ")], len(data) < MAX_BYTES_PER_POLL
        records: list[bytes] = []
        budget = MAX_BYTES_PER_POLL
        while budget > 0:
            try:
                record = os.read(self.fd, 8192)
            except BlockingIOError:
                return records, True
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the ring buffer overwrote records we had not read
                    continue
                raise
            if not record:
                return records, True
            budget -= len(record)
            records.append(record)
        return records, False

    def poll(self) -> list[LogLine]:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self.regular = stat.S_ISREG(os.fstat(self.fd).st_mode)
        records, at_end = self._records()
        lines = []
        for record in records:
            parsed = parse_kmsg_record(record)
            if parsed is None:
                continue
            line = LogLine(parsed[2], self.btime + parsed[1] / 1e6)
            if parsed[0] > self.seq:
                self.seq = parsed[0]
                lines.append(line)
            elif self.held is not None:
                self.held.append((parsed[0], line))
        if self.held is not None and at_end:
            held, self.held = self.held, None
            if not lines and held and held[-1][0] < self.saved_seq:
                # The newest record is older than the last one counted: a new boot numbering from 0.
                self.seq = held[-1][0]
                lines = [line for _, line in held]
        return lines

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class JournalReader:
    """Follows the kernel messages of journald through ``journalctl -k -f -o json`` in a thread."""

    kind = "journald"

    def __init__(self, journalctl: str = "journalctl", position: dict | None = None) -> None:
        self.cursor = position.get("cursor") if position and position.get("kind") == self.kind else None
        command = [journalctl, "-k", "-f", "-o", "json", "--no-pager"]
        command += [f"--after-cursor={self.cursor}"] if self.cursor else ["--boot", "--lines=all"]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
        self.buffer: deque[tuple[LogLine, str]] = deque(maxlen=100_000)
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._pump, name="journalctl", daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            try:
                entry = json.loads(raw)
                message = entry["MESSAGE"]
                if isinstance(message, list):  # journald gives non-UTF-8 messages as byte arrays
                    message = bytes(message).decode("utf-8", "replace")
                stamp = int(entry.get("__REALTIME_TIMESTAMP", 0)) / 1e6 or None
                cursor = entry.get("__CURSOR", "")
            except (ValueError, KeyError, TypeError):
                continue
            with self.lock:
                self.buffer.append((LogLine(str(message), stamp), cursor))

    def position(self) -> dict:
        return {"kind": self.kind, "cursor": self.cursor}

    def poll(self) -> list[LogLine]:
        with self.lock:
            items = list(self.buffer)
            self.buffer.clear()
        if items:
            self.cursor = items[-1][1] or self.cursor
        if not items and self.process.poll() is not None:
            raise RuntimeError(f"journalctl exited with code {self.process.returncode}")
        return [line for line, _ in items]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        if self.process.stdout:
            with contextlib.suppress(OSError):
                self.process.stdout.close()
