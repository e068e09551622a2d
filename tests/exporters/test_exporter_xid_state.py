"""The Xid collector across restarts: the kernel log position and the counts are saved together, so a
restarted agent neither counts old lines again nor starts its ``_total`` counters from 0.

Readers run on real files (a syslog-format kern.log, a file of /dev/kmsg records with a procfs boot_id);
the CLI tests run the agent as a process and stop it with SIGTERM, as systemd does.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from exporter_helpers import value

from exporters import kernlog
from exporters.node import NodeAgent, NodeOptions
from exporters.state import default_state_dir
from support import free_port, wait_until

CLI = [sys.executable, "-m", "fleetsight.cli", "exporter", "node"]
REPO = Path(__file__).resolve().parents[2]
BOOT_A = "4f1d7c1e-2b3a-4c5d-8e9f-0a1b2c3d4e5f"
BOOT_B = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"


def syslog_xid(code: int, bus: str, minute: int = 0) -> str:
    return (
        f"2026-11-21T11:{minute:02d}:00+00:00 n0001 kernel: NVRM: Xid (PCI:0000:{bus}:00): {code}, pid=1, "
        "name=python3, GPU has fallen off the bus."
    )


def kmsg_record(seq: int, code: int, bus: str) -> str:
    """One /dev/kmsg record as the kernel hands it over: header, message, dictionary lines."""
    return (
        f"4,{seq},{1_000_000 + seq * 1000},-;NVRM: Xid (PCI:0000:{bus}:00): {code}, pid=7, name=python3, "
        f"GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:{bus}:00.0\n"
    )


def kmsg_noise(seq: int) -> str:
    return f"6,{seq},{1_000_000 + seq * 1000},-;eth0: link becomes ready\n"


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    """A host's procfs (boot id, boot time), an empty sysfs, a kernel log and a state folder."""
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT_A + "\n")
    (proc / "stat").write_text("cpu  1 2 3 4\nbtime 1795250000\n")
    (tmp_path / "sys").mkdir()
    return {
        "proc": proc,
        "sys": tmp_path / "sys",
        "log": tmp_path / "kern.log",
        "kmsg": tmp_path / "kmsg.dump",
        "state": tmp_path / "state",
    }


def agent(host: dict[str, Path], fmt: str = "syslog", **extra) -> NodeAgent:
    opts = NodeOptions(
        node="n0001",
        sysfs_root=str(host["sys"]),
        procfs_root=str(host["proc"]),
        kmsg_file=str(host["kmsg" if fmt == "kmsg" else "log"]),
        kernel_log_format=fmt,
        nvml=False,
        collectors=("xid",),
        state_dir=str(extra.pop("state_dir", host["state"])),
        **extra,
    )
    return NodeAgent(opts)


def scrape_once(host: dict[str, Path], fmt: str = "syslog", **extra) -> str:
    """One agent's life: start, scrape, stop (a restart between every call)."""
    node_agent = agent(host, fmt, **extra)
    try:
        return node_agent.scrape().decode()
    finally:
        node_agent.close()


def xid(text: str, code: int, bus: str) -> float | None:
    return value(text, "fleetsight_gpu_xid_errors_total", xid=str(code), pci_bdf=f"0000:{bus}:00.0")


def append(path: Path, *lines: str) -> None:
    with open(path, "a") as f:
        f.writelines(line if line.endswith("\n") else line + "\n" for line in lines)


# -- /dev/kmsg: sequence numbers and boot id ------------------------------------------------------------


def test_kmsg_restart_within_a_boot_skips_counted_records_and_totals_continue(host):
    append(host["kmsg"], kmsg_noise(10), kmsg_record(11, 79, "18"), kmsg_record(12, 79, "18"))
    append(host["kmsg"], kmsg_record(13, 48, "2a"))
    first = scrape_once(host, "kmsg")
    assert xid(first, 79, "18") == 2 and xid(first, 48, "2a") == 1
    assert value(first, "fleetsight_kernel_log_lines_total") == 4
    assert value(first, "fleetsight_kernel_log_state_persisted") == 1
    # Restarted in the same boot: the buffer is read again from its oldest record, none counted again.
    again = scrape_once(host, "kmsg")
    assert xid(again, 79, "18") == 2 and xid(again, 48, "2a") == 1
    assert value(again, "fleetsight_kernel_log_lines_total") == 4
    # New records after the restart add to the saved totals.
    append(host["kmsg"], kmsg_record(14, 79, "18"))
    later = scrape_once(host, "kmsg")
    assert xid(later, 79, "18") == 3
    assert value(later, "fleetsight_collector_success", collector="xid") == 1
    saved = json.loads((host["state"] / "xid-n0001.json").read_text())
    assert saved["position"] == {"kind": "kmsg", "path": str(host["kmsg"]), "boot_id": BOOT_A, "seq": 14}


def test_kmsg_after_a_reboot_the_new_boots_records_are_read_from_the_start(host):
    append(host["kmsg"], *(kmsg_noise(s) for s in range(40)), kmsg_record(40, 79, "18"))
    assert xid(scrape_once(host, "kmsg"), 79, "18") == 1
    # Reboot: a new boot id, and the kernel numbers its records from 0 again.
    (host["proc"] / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT_B + "\n")
    host["kmsg"].write_text(kmsg_noise(0) + kmsg_record(1, 79, "18") + kmsg_record(2, 94, "3a"))
    after = scrape_once(host, "kmsg")
    # Records 1 and 2 are below the old boot's 40, yet new: counted, onto the persisted totals.
    assert xid(after, 79, "18") == 2
    assert xid(after, 94, "3a") == 1
    assert xid(scrape_once(host, "kmsg"), 79, "18") == 2  # and once only


def test_kmsg_without_a_boot_id_a_sequence_that_went_back_means_a_reboot(host):
    (host["proc"] / "sys" / "kernel" / "random" / "boot_id").unlink()
    append(host["kmsg"], kmsg_noise(5), kmsg_record(6, 79, "18"), kmsg_noise(7))
    assert xid(scrape_once(host, "kmsg"), 79, "18") == 1
    assert xid(scrape_once(host, "kmsg"), 79, "18") == 1  # same numbering: nothing new
    host["kmsg"].write_text(kmsg_record(0, 79, "18") + kmsg_noise(1))  # numbering restarted
    assert xid(scrape_once(host, "kmsg"), 79, "18") == 2


def test_kmsg_record_parser():
    record = b"4,1234,5678901,-,caller=T1;NVRM: Xid (PCI:0000:18:00): 79, GPU gone\n SUBSYSTEM=pci\n"
    assert kernlog.parse_kmsg_record(record) == (1234, 5678901, "NVRM: Xid (PCI:0000:18:00): 79, GPU gone")
    assert kernlog.parse_kmsg_record(b"no header at all") is None
    assert kernlog.parse_kmsg_record(b"6,x,1,-;text") is None


# -- syslog files: inode, offset, and the bytes before the offset -----------------------------------


def test_file_restart_does_not_recount_and_totals_continue(host):
    append(host["log"], syslog_xid(79, "18"), syslog_xid(79, "18"), syslog_xid(13, "2a"))
    assert xid(scrape_once(host), 79, "18") == 2
    again = scrape_once(host)
    assert xid(again, 79, "18") == 2 and xid(again, 13, "2a") == 1
    append(host["log"], syslog_xid(79, "18", 5))
    assert xid(scrape_once(host), 79, "18") == 3


def test_file_rotated_while_the_agent_was_down_reads_the_old_files_tail_then_the_new_file(host):
    append(host["log"], syslog_xid(79, "18"))
    assert xid(scrape_once(host), 79, "18") == 1
    # While the agent is down: a line lands in the log, logrotate renames it, the kernel's last line
    # before the reopen lands in the renamed file, and the new log gets lines of its own.
    append(host["log"], syslog_xid(79, "18", 1))
    os.rename(host["log"], str(host["log"]) + ".1")
    append(Path(str(host["log"]) + ".1"), syslog_xid(48, "2a", 2))
    append(host["log"], syslog_xid(79, "18", 3), syslog_xid(94, "3a", 4))
    text = scrape_once(host)
    assert xid(text, 79, "18") == 3  # the saved one, the old file's tail, the new file's
    assert xid(text, 48, "2a") == 1 and xid(text, 94, "3a") == 1
    again = scrape_once(host)
    assert xid(again, 79, "18") == 3 and xid(again, 48, "2a") == 1 and xid(again, 94, "3a") == 1


def rotate(log: Path, compress_from: int | None = None) -> None:
    """What logrotate does to ``log`` (``rotate 4``, optionally ``compress`` + ``delaycompress``): every
    copy moves up one number, the log becomes ``.1``; copies from ``compress_from`` on are gzipped."""
    for n in range(4, 0, -1):
        for suffix in ("", ".gz"):
            old = Path(f"{log}.{n}{suffix}")
            if old.exists():
                old.rename(f"{log}.{n + 1}{suffix}")
    log.rename(f"{log}.1")
    if compress_from is not None:
        for n in range(compress_from, 6):
            plain = Path(f"{log}.{n}")
            if plain.exists():
                with open(plain, "rb") as src, gzip.open(f"{plain}.gz", "wb") as dst:
                    shutil.copyfileobj(src, dst)
                plain.unlink()


@pytest.mark.parametrize("compress_from", [None, 2], ids=["plain", "delaycompress"])
def test_file_rotated_twice_while_the_agent_was_down(host, compress_from):
    log = host["log"]
    append(log, syslog_xid(79, "18"))
    assert xid(scrape_once(host), 79, "18") == 1
    # Down: the saved file gets a line, is rotated, the next log gets lines and is rotated too (the
    # saved file is now .2, or .2.gz), and the current log gets lines of its own.
    append(log, syslog_xid(79, "18", 1))
    rotate(log, compress_from)
    append(log, syslog_xid(48, "2a", 2), syslog_xid(48, "2a", 3))
    rotate(log, compress_from)
    append(log, syslog_xid(94, "3a", 4))
    assert Path(f"{log}.2.gz" if compress_from else f"{log}.2").exists()
    text = scrape_once(host)
    assert xid(text, 79, "18") == 2  # the saved one and the line after the save, in .2
    assert xid(text, 48, "2a") == 2  # all of .1
    assert xid(text, 94, "3a") == 1  # the current log
    again = scrape_once(host)  # nothing counted twice after another restart
    assert (xid(again, 79, "18"), xid(again, 48, "2a"), xid(again, 94, "3a")) == (2, 2, 1)
    append(log, syslog_xid(94, "3a", 5))
    assert xid(scrape_once(host), 94, "3a") == 2


@pytest.mark.parametrize("compress_from", [None, 2], ids=["plain", "delaycompress"])
def test_a_restart_while_finishing_a_rotated_file_goes_on_from_there(host, compress_from):
    log = host["log"]
    append(log, syslog_xid(79, "18"))
    assert xid(scrape_once(host), 79, "18") == 1
    # More than one scrape reads (8 MiB) lands in the saved file before it is rotated twice: the first
    # agent stops inside it, and the next one must find it again and go on from there.
    noise = "2026-11-21T11:00:30+00:00 n0001 kernel: mlx5_core 0000:19:00.0: health poll ok, no issue\n"
    with open(log, "a") as f:
        f.write(noise * (9 * (1 << 20) // len(noise)))
    append(log, syslog_xid(79, "18", 1))
    rotate(log, compress_from)
    append(log, syslog_xid(48, "2a", 2))
    rotate(log, compress_from)
    append(log, syslog_xid(94, "3a", 3))
    first = scrape_once(host)
    assert (xid(first, 79, "18"), xid(first, 48, "2a")) == (1, None)  # still inside the old file
    text = scrape_once(host)
    assert (xid(text, 79, "18"), xid(text, 48, "2a"), xid(text, 94, "3a")) == (2, 1, 1)


def test_file_copytruncated_while_the_agent_was_down_reads_the_copys_tail_then_the_log(host):
    log = host["log"]
    append(log, syslog_xid(79, "18"))
    assert xid(scrape_once(host), 79, "18") == 1
    # logrotate's copytruncate: the log (same inode) is copied to .1, then emptied and written again.
    append(log, syslog_xid(79, "18", 1))
    shutil.copyfile(log, f"{log}.1")
    with open(log, "r+") as f:
        f.truncate(0)
    append(log, syslog_xid(48, "2a", 2))
    text = scrape_once(host)
    assert (xid(text, 79, "18"), xid(text, 48, "2a")) == (2, 1)
    again = scrape_once(host)
    assert (xid(again, 79, "18"), xid(again, 48, "2a")) == (2, 1)


def test_file_rotated_and_recreated_while_running_and_across_a_restart(host):
    append(host["log"], syslog_xid(79, "18"))
    running = agent(host)
    assert xid(running.scrape().decode(), 79, "18") == 1
    os.rename(host["log"], str(host["log"]) + ".1")
    append(Path(str(host["log"]) + ".1"), syslog_xid(79, "18", 1))
    append(host["log"], syslog_xid(79, "18", 2))
    assert xid(running.scrape().decode(), 79, "18") == 3
    running.close()
    assert xid(scrape_once(host), 79, "18") == 3


def test_file_truncated_while_the_agent_was_down_is_read_from_its_top(host):
    append(host["log"], *(syslog_xid(13, "2a", m) for m in range(5)))
    assert xid(scrape_once(host), 13, "2a") == 5
    host["log"].write_text(syslog_xid(79, "18") + "\n")  # shorter than the saved offset
    text = scrape_once(host)
    assert xid(text, 79, "18") == 1 and xid(text, 13, "2a") == 5
    # copytruncate, then written past the old size before the agent came back: the bytes before the
    # saved offset changed, so the file is new content from its top.
    host["log"].write_text("".join(syslog_xid(31, "3a", m) + "\n" for m in range(3)))
    text = scrape_once(host)
    assert xid(text, 31, "3a") == 3 and xid(text, 79, "18") == 1


def test_a_line_half_written_at_a_restart_is_counted_once_complete(host):
    line = syslog_xid(79, "18")
    with open(host["log"], "w") as f:
        f.write(line[:60])
    assert xid(scrape_once(host), 79, "18") is None
    with open(host["log"], "a") as f:
        f.write(line[60:] + "\n")
    assert xid(scrape_once(host), 79, "18") == 1
    assert xid(scrape_once(host), 79, "18") == 1


def test_a_state_saved_for_another_log_is_not_taken_as_this_ones(host, tmp_path):
    append(host["log"], syslog_xid(79, "18"))
    assert xid(scrape_once(host), 79, "18") == 1
    other = tmp_path / "other.log"
    append(other, syslog_xid(48, "2a"))
    text = scrape_once({**host, "log": other})
    assert xid(text, 48, "2a") == 1 and xid(text, 79, "18") is None


# -- an unwritable state folder ----------------------------------------------------------------------


def test_an_unwritable_state_dir_is_reported_and_counting_goes_on_in_memory(host, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the state folder's parent should be\n")
    append(host["log"], syslog_xid(79, "18"))
    running = agent(host, state_dir=blocker / "state")
    text = running.scrape().decode()
    assert xid(text, 79, "18") == 1
    assert value(text, "fleetsight_kernel_log_state_persisted") == 0
    assert value(text, "fleetsight_collector_errors_total", collector="xid", source="state") == 1
    assert value(text, "fleetsight_collector_success", collector="xid") == 0
    append(host["log"], syslog_xid(79, "18", 1))
    text = running.scrape().decode()
    assert xid(text, 79, "18") == 2
    assert value(text, "fleetsight_collector_errors_total", collector="xid", source="state") == 2
    # The folder becomes writable: the next scrape saves, and the report clears.
    blocker.unlink()
    text = running.scrape().decode()
    assert value(text, "fleetsight_kernel_log_state_persisted") == 1
    assert value(text, "fleetsight_collector_success", collector="xid") == 1
    running.close()
    assert xid(scrape_once(host, state_dir=blocker / "state"), 79, "18") == 2


# -- the default state folder ------------------------------------------------------------------------


def test_default_state_dir_rules(tmp_path):
    writable = str(tmp_path / "var" / "lib" / "fleetsight" / "node-agent")
    blocked_parent = tmp_path / "file"
    blocked_parent.write_text("")
    blocked = str(blocked_parent / "node-agent")
    env = {"STATE_DIRECTORY": "/run/a:/run/b", "XDG_STATE_HOME": "/x", "HOME": "/home/u"}
    assert default_state_dir(env, writable) == ("/run/a", "STATE_DIRECTORY")
    del env["STATE_DIRECTORY"]
    assert default_state_dir(env, writable) == (writable, "system")
    assert default_state_dir(env, blocked) == ("/x/fleetsight/node-agent", "XDG_STATE_HOME")
    env["XDG_STATE_HOME"] = "relative/path"  # the XDG spec: ignored
    assert default_state_dir(env, blocked) == ("/home/u/.local/state/fleetsight/node-agent", "home")
    assert not (tmp_path / "var").exists()  # choosing creates nothing


# -- the CLI, as systemd runs it --------------------------------------------------------------------


@contextmanager
def served_agent(host: dict[str, Path], env: dict[str, str], *flags: str) -> Iterator[tuple[str, list[str]]]:
    """A node agent process serving /metrics; yields its URL and, after it stopped, its log lines."""
    port = free_port()
    command = [
        *CLI,
        *("--node", "n0001", "--no-nvml", "--collector", "xid", "--listen", f"127.0.0.1:{port}"),
        *("--procfs-root", str(host["proc"]), "--sysfs-root", str(host["sys"])),
        *("--kmsg-file", str(host["log"]), *flags),
    ]
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    output: list[str] = []
    try:
        yield f"http://127.0.0.1:{port}/metrics", output
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
        output.extend(stderr.splitlines())
    assert process.returncode == 0, "\n".join(output)


def metrics_where(url: str, check) -> str:
    def ready() -> str | None:
        try:
            response = httpx.get(url, timeout=5)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 and check(response.text) else None

    return wait_until(ready, timeout=30, what=f"{url} to show the expected counts")


def test_cli_agent_is_restart_safe_without_flags(host, tmp_path):
    """No --state-dir: under systemd ($STATE_DIRECTORY) the state goes there, and a restart continues."""
    state = tmp_path / "systemd-state"
    env = {**os.environ, "STATE_DIRECTORY": str(state)}
    append(host["log"], syslog_xid(79, "18"), syslog_xid(79, "18"))
    with served_agent(host, env) as (url, log):
        metrics_where(url, lambda t: xid(t, 79, "18") == 2)
        append(host["log"], syslog_xid(79, "18", 1))
        metrics_where(url, lambda t: xid(t, 79, "18") == 3)
    assert any("event=state_dir" in line and f"path={state}" in line for line in log), log
    assert any("origin=STATE_DIRECTORY" in line for line in log), log
    append(host["log"], syslog_xid(48, "2a", 2))  # written while the agent is down
    with served_agent(host, env) as (url, _):
        text = metrics_where(url, lambda t: xid(t, 48, "2a") == 1)
        assert xid(text, 79, "18") == 3  # continued, not re-counted and not reset
    # --once shows the same totals and leaves the state as it was.
    saved = (state / "xid-n0001.json").read_bytes()
    once = subprocess.run(
        [
            *(*CLI, "--once", "--node", "n0001", "--no-nvml", "--collector", "xid"),
            *("--kmsg-file", str(host["log"]), "--procfs-root", str(host["proc"])),
            *("--sysfs-root", str(host["sys"])),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert once.returncode == 0, once.stderr
    assert xid(once.stdout, 79, "18") == 3 and xid(once.stdout, 48, "2a") == 1
    assert (state / "xid-n0001.json").read_bytes() == saved


def test_cli_agent_with_an_unwritable_state_dir_says_so_and_keeps_serving(host, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    append(host["log"], syslog_xid(79, "18"))
    with served_agent(host, dict(os.environ), "--state-dir", str(blocker / "state")) as (url, log):
        text = metrics_where(url, lambda t: xid(t, 79, "18") == 1)
        assert value(text, "fleetsight_kernel_log_state_persisted") == 0
        assert value(text, "fleetsight_collector_errors_total", collector="xid", source="state") >= 1
    assert any("event=state_dir_unwritable" in line for line in log), log
    assert not any("Traceback" in line for line in log), log
