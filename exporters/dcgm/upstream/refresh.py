"""Regenerate the vendored dcgm-exporter and go-dcgm data files in this folder from git checkouts.

Usage (bare git directories work: everything is read with ``git show``)::

    python exporters/dcgm/upstream/refresh.py --exporter DIR --exporter-ref 4.4.2-4.7.0 \
        --go-dcgm DIR --go-dcgm-ref 0b1e78b1ccea39f7b44d07d0740f11584a5e52a7 \
        --go-dcgm-ref b7fa31542404a9090ad0d1aabbbe592afbe234cb

Writes ``default-counters.csv`` and ``dcp-metrics-included.csv`` (verbatim), ``xid-messages.csv`` (the
``err_msg`` texts of ``internal/pkg/collector/xid_errors.go``) and one ``go-dcgm-fields-<short>.csv`` per
go-dcgm commit (``name,id,current|legacy`` from ``pkg/dcgm/const_fields.go``). PROVENANCE.md records the
commits; update it by hand when they change.
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
COUNTER_FILES = ("etc/default-counters.csv", "etc/dcp-metrics-included.csv")
FIELDS_GO = "pkg/dcgm/const_fields.go"
XID_GO = "internal/pkg/collector/xid_errors.go"

# `NAME Short = 150` or `NAME Short = OTHER_NAME` inside the const block.
CONST_RE = re.compile(r"^\s*(DCGM_FI_\w+)\s+Short\s*=\s*(\w+)\s*$")
# `"NAME": 150,` or `"NAME": CONST_NAME, // 150` inside a map literal.
ENTRY_RE = re.compile(r'^\s*"(\w+)"\s*:\s*(\w+)\s*,')
MAP_RE = re.compile(r"^var (dcgmFields|legacyDCGMFields) = map\[string\]Short\{")
XID_RE = re.compile(r'^\s*(\d+)\s*:\s*"((?:[^"\\]|\\.)*)",')


def git_show(repo: Path, ref: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"{ref}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def resolve_consts(source: str) -> dict[str, int]:
    """Every `DCGM_FI_* Short = ...` constant as a number; an alias names another constant."""
    raw = {m[1]: m[2] for line in source.splitlines() if (m := CONST_RE.match(line))}
    values: dict[str, int] = {}

    def value(name: str, seen: frozenset[str] = frozenset()) -> int:
        if name in values:
            return values[name]
        target = raw[name]
        if name in seen:
            raise ValueError(f"{FIELDS_GO}: constant cycle at {name}")
        values[name] = int(target) if target.isdigit() else value(target, seen | {name})
        return values[name]

    for name in raw:
        value(name)
    return values


def field_rows(source: str) -> list[tuple[str, int, str]]:
    """(name, id, current|legacy) for every entry of go-dcgm's two name maps, in file order."""
    consts = resolve_consts(source)
    rows: list[tuple[str, int, str]] = []
    kind = ""
    for line in source.splitlines():
        if started := MAP_RE.match(line):
            kind = "current" if started[1] == "dcgmFields" else "legacy"
        elif kind and line.startswith("}"):
            kind = ""
        elif kind and (entry := ENTRY_RE.match(line)):
            expr = entry[2]
            rows.append((entry[1], int(expr) if expr.isdigit() else consts[expr], kind))
    return rows


def write_fields(repo: Path, ref: str) -> Path:
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", ref], check=True, capture_output=True, text=True
    ).stdout.strip()
    path = HERE / f"go-dcgm-fields-{commit[:7]}.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["name", "id", "table"])
        writer.writerows(field_rows(git_show(repo, commit, FIELDS_GO)))
    return path


def write_xid_messages(repo: Path, ref: str) -> Path:
    path = HERE / "xid-messages.csv"
    rows = [
        (int(m[1]), m[2]) for line in git_show(repo, ref, XID_GO).splitlines() if (m := XID_RE.match(line))
    ]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["code", "err_msg"])
        writer.writerows(rows)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--exporter", type=Path, required=True, help="dcgm-exporter git directory")
    parser.add_argument("--exporter-ref", required=True, help="the tag of the image FleetSight pins")
    parser.add_argument("--go-dcgm", type=Path, required=True, help="go-dcgm git directory")
    parser.add_argument("--go-dcgm-ref", action="append", required=True, help="a commit (repeatable)")
    args = parser.parse_args()
    for name in COUNTER_FILES:
        (HERE / Path(name).name).write_text(git_show(args.exporter, args.exporter_ref, name))
    print(write_xid_messages(args.exporter, args.exporter_ref))
    for ref in args.go_dcgm_ref:
        print(write_fields(args.go_dcgm, ref))


if __name__ == "__main__":
    main()
