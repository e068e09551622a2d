"""The chatbot's own ``/metrics`` (scraped as job ``fleetsight-chatbot``): answers by mode, answer time,
live sources that failed, Slack requests by outcome, and the index's size and rebuilds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .answer import Answer
from .index import DocIndex

# Extractive answers take milliseconds; a language model seconds.
ANSWER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class IndexCollector(Collector):
    """The index as it is at scrape time."""

    def __init__(self, index: DocIndex) -> None:
        self.index = index

    def collect(self) -> Iterator[Any]:
        sections = self.index.sections
        files = GaugeMetricFamily("fleetsight_chatbot_index_files", "Markdown files in the search index")
        files.add_metric([], float(len({s.file for s in sections})))
        yield files
        count = GaugeMetricFamily("fleetsight_chatbot_index_sections", "Sections (## headings) in the index")
        count.add_metric([], float(len(sections)))
        yield count
        builds = CounterMetricFamily(
            "fleetsight_chatbot_index_builds", "Index builds (start-up and doc changes)"
        )
        builds.add_metric([], float(self.index.builds))
        yield builds


class ChatMetrics:
    def __init__(self, index: DocIndex) -> None:
        self.registry = CollectorRegistry()
        self.answers = Counter(
            "fleetsight_chatbot_answers_total",
            "Answers given, by mode (extractive, llm, extractive-fallback, declined)",
            ["mode"],
            registry=self.registry,
        )
        self.answer_seconds = Histogram(
            "fleetsight_chatbot_answer_duration_seconds",
            "Time to answer a question, live look-ups and language model included",
            buckets=ANSWER_BUCKETS,
            registry=self.registry,
        )
        self.live_errors = Counter(
            "fleetsight_chatbot_live_source_errors_total",
            "Live look-ups that failed (unreachable, timed out, unreadable), by source",
            ["source"],
            registry=self.registry,
        )
        self.slack = Counter(
            "fleetsight_chatbot_slack_requests_total",
            "Slack slash-command requests by outcome (answered, refused, invalid)",
            ["outcome"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "fleetsight_chatbot_rate_limited_total",
            "Asks refused because their caller asked too often (API: 429, Slack: told to wait)",
            registry=self.registry,
        )
        self.registry.register(IndexCollector(index))

    def record(self, answer: Answer) -> None:
        self.answers.labels(answer.mode).inc()
        self.answer_seconds.observe(answer.took_ms / 1000)
        for source in answer.live_failures:
            self.live_errors.labels(source).inc()
