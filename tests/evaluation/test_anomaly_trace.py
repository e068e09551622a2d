"""bench/anomaly_trace.py, the per-window trace of one job through the detector: it prints the flag the
evaluation scores, at the same window, with the node's figures that led to it, and says so when the job
it was asked for never ran."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from evaluation import anomaly as evaluation
from evaluation.scenarios import resolve as resolve_scenario
from twin.scenario import load as load_scenario

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "bench" / "anomaly_trace.py"
SCENARIO = "gray_x13_8n"  # n0003 of job 7002 runs x1.3 from minute 15 for 15 minutes


def _trace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TRACE), *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )


def test_the_trace_shows_the_evaluations_flag_with_the_figures_behind_it() -> None:
    path = resolve_scenario(SCENARIO)
    run = evaluation.run_scenario(path, duration=22 * 60.0)
    flags = [e for e in run.events["detector"] if e.kind == "flag"]
    assert [(e.straggler.job, e.straggler.node) for e in flags] == [("7002", "n0003")], flags
    start = load_scenario(path).start.timestamp()
    flag_minute = (flags[0].time - start) / 60.0

    done = _trace(str(path), "--job", "7002", "--node", "n0003", "--from", "14m", "--to", "22m")
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert rows and all(row[2] == "n0003" for row in rows), done.stdout
    flagged = [row for row in rows if any(cell.startswith("flag(") for cell in row)]
    assert len(flagged) == 1, done.stdout
    assert abs(float(flagged[0][0]) - flag_minute) < 0.01, (flagged, flag_minute)
    z, resid = float(flagged[0][3]), float(flagged[0][4])
    assert z >= 4.0 and resid >= 0.08, flagged  # the detector's z threshold and slow floor
    before_onset = [row for row in rows if float(row[0]) < 15.0]
    assert before_onset and all(float(row[3]) < 4.0 for row in before_onset), done.stdout


def test_a_job_that_never_ran_is_an_error_naming_the_jobs_that_did() -> None:
    done = _trace(str(resolve_scenario(SCENARIO)), "--job", "99", "--to", "2m")
    assert done.returncode == 1
    assert "job '99' was never scored" in done.stderr and "7002" in done.stderr, done.stderr


def test_a_bad_time_is_a_usage_error() -> None:
    done = _trace(str(resolve_scenario(SCENARIO)), "--job", "7002", "--to", "soon")
    assert done.returncode == 2
    assert "--to soon" in done.stderr, done.stderr


def test_the_trace_may_start_at_the_start_but_not_after_its_end() -> None:
    path = str(resolve_scenario(SCENARIO))
    done = _trace(path, "--job", "7002", "--node", "n0003", "--from", "0m", "--to", "3m")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) > 1, done.stdout
    unbounded = _trace(path, "--job", "7002", "--node", "n0003", "--to", "3m")
    assert done.stdout == unbounded.stdout  # from the first scored window, as without --from
    backwards = _trace(path, "--job", "7002", "--from", "5m", "--to", "3m")
    assert backwards.returncode == 2
    assert "--from 5m is not before --to 3m" in backwards.stderr, backwards.stderr
