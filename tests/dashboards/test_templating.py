"""Grafana's macros and variable formats as dashboards/templating.py expands them, one test each, against
the example or the rule of Grafana's own documentation (cited per test). The runner that sends the
expanded queries to the real Prometheus and OpenSearch is tested in test_dashboards.py."""

from __future__ import annotations

import pytest

from dashboards.templating import ALL, Selected, builtins, interpolate, selection

HOUR = 3600.0


def test_rate_interval_is_interval_plus_scrape_at_least_four_scrapes() -> None:
    """https://grafana.com/docs/grafana/latest/datasources/prometheus/template-variables/#use-__rate_interval
    (and the 7.2 announcement, https://grafana.com/blog/2020/09/28/new-in-grafana-7.2-__rate_interval-for-
    prometheus-rate-queries-that-just-work/): max($__interval + scrape interval, 4 * scrape interval)."""
    # 1 h at 60 points: $__interval 1m; scrape 15s -> max(75s, 60s)
    assert builtins(0, HOUR, scrape_s=15, max_data_points=60)["__rate_interval"] == "75s"
    # 5 min at 1000 points: $__interval floored at the 15s scrape -> max(30s, 60s)
    assert builtins(0, 300, scrape_s=15, max_data_points=1000)["__rate_interval"] == "1m"


def test_interval_is_range_over_max_data_points_rounded_not_below_min_interval() -> None:
    """https://grafana.com/docs/grafana/latest/panels-visualizations/query-transform-data/#query-options
    ("Max data points", "Min interval": a lower limit for the calculated interval, typically the scrape
    interval) and https://grafana.com/docs/grafana/latest/dashboards/variables/add-template-variables/
    #__interval (1 h range -> a 2m interval: points grouped in 2 minute intervals)."""
    assert builtins(0, HOUR, scrape_s=5, max_data_points=30)["__interval"] == "2m"
    assert builtins(0, HOUR, scrape_s=5, max_data_points=30)["__interval_ms"] == "120000"
    # 3.6 s is no readable step: it rounds to 5s; 2.4 s would round to 2s (then the 1s min applies)
    assert builtins(0, HOUR, scrape_s=1, max_data_points=1000)["__interval"] == "5s"
    assert builtins(0, 2400, scrape_s=1, max_data_points=1000)["__interval"] == "2s"
    # 5 min / 1000 points is 0.3 s: the min interval (the datasource's scrape interval, 5s) wins
    assert builtins(0, 300, scrape_s=5, max_data_points=1000)["__interval"] == "5s"


def test_range_in_seconds_and_milliseconds() -> None:
    """https://grafana.com/docs/grafana/latest/dashboards/variables/add-template-variables/#__range: the
    dashboard's range, to - from, with $__range_s and $__range_ms representations."""
    found = builtins(1_700_000_000, 1_700_000_000 + 6 * HOUR, scrape_s=5)
    assert (found["__range"], found["__range_s"], found["__range_ms"]) == ("21600s", "21600", "21600000")
    assert interpolate("x[$__range] / ${__range_s}", found) == "x[21600s] / 21600"


def test_csv_format() -> None:
    """https://grafana.com/docs/grafana/latest/dashboards/variables/variable-syntax/#csv:
    servers = ['test1', 'test2'], '${servers:csv}' -> 'test1,test2'."""
    assert (
        interpolate("${servers:csv}", {"servers": Selected(("test1", "test2"), multi=True)}) == "test1,test2"
    )


def test_pipe_format() -> None:
    """https://grafana.com/docs/grafana/latest/dashboards/variables/variable-syntax/#pipe:
    servers = ['test1.', 'test2'], '${servers:pipe}' -> 'test1.|test2' (no escaping)."""
    assert (
        interpolate("${servers:pipe}", {"servers": Selected(("test1.", "test2"), multi=True)})
        == "test1.|test2"
    )


def test_regex_format() -> None:
    """https://grafana.com/docs/grafana/latest/dashboards/variables/variable-syntax/#regex:
    servers = ['test1.', 'test2'], '${servers:regex}' -> '(test1\\.|test2)'."""
    servers = Selected(("test1.", "test2"), multi=True)
    assert interpolate("${servers:regex}", {"servers": servers}) == r"(test1\.|test2)"


def test_lucene_format() -> None:
    """https://grafana.com/docs/grafana/latest/dashboards/variables/variable-syntax/#lucene:
    servers = ['test', 'test2'], '${servers:lucene}' -> '("test" OR "test2")'; it is also the Elasticsearch
    datasource's default for a multi-value variable."""
    servers = Selected(("test", "test2"), multi=True)
    assert interpolate("${servers:lucene}", {"servers": servers}) == '("test" OR "test2")'
    assert interpolate("host:$servers", {"servers": servers}, "elasticsearch") == 'host:("test" OR "test2")'


def test_raw_format() -> None:
    """https://grafana.com/docs/grafana/latest/dashboards/variables/variable-syntax/#raw:
    servers = ['test.1', 'test2'], '${servers:raw}' -> '{test.1,test2}'."""
    assert (
        interpolate("${servers:raw}", {"servers": Selected(("test.1", "test2"), multi=True)})
        == "{test.1,test2}"
    )


def test_an_unknown_format_fails_loudly() -> None:
    with pytest.raises(ValueError, match="unknown variable format 'sqlstring'"):
        interpolate("${servers:sqlstring}", {"servers": "a"})


def test_dollar_braces_and_the_deprecated_brackets_are_the_same_variable() -> None:
    """https://grafana.com/docs/grafana/latest/dashboards/variables/variable-syntax/: `$varname`,
    `${var_name}` (also in the middle of a word), `${var_name:<format>}` and the deprecated
    `[[varname]]`; an unknown name is left as it is."""
    values = {"server": "web1"}
    text = "apps.frontend.$server.requests ${server}x [[server]] [[server:csv]] $other"
    assert interpolate(text, values) == "apps.frontend.web1.requests web1x web1 web1 $other"


def test_prometheus_multi_value_is_a_regex_of_escaped_values() -> None:
    """https://grafana.com/docs/grafana/latest/datasources/prometheus/template-variables/#use-variables-in-
    queries and .../dashboards/variables/variable-syntax/#multi-value-variables-with-a-prometheus-or-influxdb-
    data-source: with Multi-value or Include All on, a Prometheus variable becomes `(host1|host2|host3)`,
    every value regex-escaped (use =~). The escape's backslash is doubled for PromQL's quoted string; a
    single selection of such a variable is its escaped value; a plain variable is left as it is."""
    hosts = Selected(("host1", "host2", "host3"), multi=True)
    assert interpolate('up{node=~"$node"}', {"node": hosts}) == 'up{node=~"(host1|host2|host3)"}'
    dotted = Selected(("n.1", "n2"), multi=True)
    assert interpolate('up{node=~"$node"}', {"node": dotted}) == 'up{node=~"(n\\\\.1|n2)"}'
    assert interpolate("$node", {"node": Selected(("n.1",), include_all=True)}) == "n\\\\.1"
    assert interpolate("$node", {"node": Selected(("n.1",))}) == "n.1"


def test_all_is_every_value_or_the_custom_all_value_never_escaped() -> None:
    """https://grafana.com/docs/grafana/latest/dashboards/variables/add-template-variables/#configure-
    variable-selection-options: the All option includes all options in a combined expression unless a
    Custom all value is set (e.g. a wildcard regex), which is never escaped."""
    variable = {"name": "node", "multi": False, "includeAll": True}
    every = selection(variable, [ALL, "n1", "n.2"])
    assert interpolate('{node=~"$node"}', {"node": every}) == '{node=~"(n1|n\\\\.2)"}'
    custom = selection({**variable, "allValue": ".*"}, [ALL, "n1", "n.2"])
    assert interpolate('{node=~"$node"}', {"node": custom}) == '{node=~".*"}'
    assert interpolate("${node:csv}", {"node": custom}) == ".*"
