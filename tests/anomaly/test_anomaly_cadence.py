"""What each DCGM sample averages reaches the detector (issue 42, docs/anomaly.md "Sampling cadence"):
`fleetsight evaluate anomaly --sample-window` replaces the scenario's realism and tells the detector, as
`fleetsight anomaly serve --dcgm-interval` tells the service; bad values are refused before anything
runs."""

from __future__ import annotations

from click.testing import CliRunner

from anomaly.cli import cli as anomaly_cli
from evaluation import anomaly as evaluation
from evaluation.anomaly_feed import TwinFeed
from evaluation.cli import cli as evaluation_cli
from evaluation.scenarios import resolve


def test_the_sample_window_replaces_the_scenarios_and_reaches_the_detector() -> None:
    path = resolve("fault_free_12n_4h")
    assert TwinFeed(path).scenario.realism.sample_window == 1.0  # the twin's default
    assert TwinFeed(path, sample_window=5.0).scenario.realism.sample_window == 5.0
    detector = evaluation.METHODS["detector"](5.0)
    assert detector.config.sample_average_s == 5.0 and detector.config.fast_windows == 1
    assert evaluation.METHODS["detector"](1.0).config.sample_average_s == 1.0


def test_bad_sample_windows_and_intervals_are_refused() -> None:
    runner = CliRunner()
    for value in ("2m", "fast", "0s"):
        result = runner.invoke(
            evaluation_cli, ["anomaly", "--scenario", "fault_free_12n_4h", "--sample-window", value]
        )
        assert result.exit_code != 0 and "--sample-window" in result.output, (value, result.output)
    for value in ("soon", "0s", "1h"):
        result = runner.invoke(
            anomaly_cli, ["serve", "--prometheus-url", "http://127.0.0.1:9", "--dcgm-interval", value]
        )
        assert result.exit_code == 2 and "--dcgm-interval" in result.output, (value, result.output)
