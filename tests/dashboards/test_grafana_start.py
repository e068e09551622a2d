"""Grafana's first-start race (dashboards/grafana.py, FIRST_START_RACE): a start that dies of it is
started again; any other early exit fails at once. The binary is the real Grafana behind a wrapper that
dies first, as the pinned build does when the race strikes, so the retry itself runs for real."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from dashboards import grafana
from fleetsight.settings import Settings
from tests.support import free_port_base

NO_BACKEND = "http://127.0.0.1:1"
RACE_LOG = (
    'logger=sqlstore level=error msg="failed to insert organization with provided id" org_id=1 '
    'err="UNIQUE constraint failed: org.id"\n'
    "Error: \u2717 failed to create default organization: UNIQUE constraint failed: org.id"
)


def wrapped_grafana(tmp_path: Path, first_words: str, deaths: int) -> Settings:
    """Settings whose Grafana prints first_words and exits 1 on its first `deaths` starts, then runs
    the real server; each start is counted in tmp_path/starts."""
    real = Settings()
    if grafana.missing(real):
        pytest.fail(grafana.missing(real))
    settings = dataclasses.replace(real, cache_dir=tmp_path / "cache")
    settings.bin_dir.mkdir(parents=True)
    (settings.cache_dir / "grafana-home").symlink_to(grafana.home(real))
    shutil.copy(grafana.GRAFANA_BUILD.stamp_file(real), grafana.GRAFANA_BUILD.stamp_file(settings))
    starts = tmp_path / "starts"
    script = f"""#!/bin/sh
echo start >> '{starts}'
if [ "$(wc -l < '{starts}')" -le {deaths} ]; then
  cat <<'EOF'
{first_words}
EOF
  exit 1
fi
exec '{grafana.binary(real)}' "$@"
"""
    wrapper = grafana.binary(settings)
    wrapper.write_text(script)
    wrapper.chmod(0o755)
    assert grafana.present(settings), "the wrapper must pass for the pinned build"
    return settings


def start_count(tmp_path: Path) -> int:
    return len((tmp_path / "starts").read_text().splitlines())


def test_a_first_start_lost_to_the_org_race_is_started_again(tmp_path: Path) -> None:
    settings = wrapped_grafana(tmp_path, RACE_LOG, deaths=1)
    port = free_port_base() + 146
    with grafana.running(settings, port, tmp_path / "data", NO_BACKEND, NO_BACKEND) as url:
        assert grafana.ready(url)
    assert start_count(tmp_path) == 2
    assert grafana.FIRST_START_RACE in (tmp_path / "data" / "grafana.log").read_text()


def test_any_other_early_exit_fails_at_once_with_the_log(tmp_path: Path) -> None:
    settings = wrapped_grafana(tmp_path, "Error: \u2717 could not open the database", deaths=1)
    port = free_port_base() + 146
    expected = pytest.raises(grafana.GrafanaExited, match="could not open the database")
    with expected, grafana.running(settings, port, tmp_path / "data", NO_BACKEND, NO_BACKEND):
        pass
    assert start_count(tmp_path) == 1


def test_the_race_every_time_gives_up_after_the_last_attempt(tmp_path: Path) -> None:
    settings = wrapped_grafana(tmp_path, RACE_LOG, deaths=grafana.START_ATTEMPTS)
    port = free_port_base() + 146
    expected = pytest.raises(grafana.GrafanaExited, match="failed to create default organization")
    with expected, grafana.running(settings, port, tmp_path / "data", NO_BACKEND, NO_BACKEND):
        pass
    assert start_count(tmp_path) == grafana.START_ATTEMPTS
