"""The Prometheus exposition side of the exporters: metric families built by name with the runner's
constant labels (``node``), and one fast renderer of the text format.

Its own module because it changes with the exposition format and its cost per sample, not with how
sources are scheduled (exporters/runners.py) or what they read (the collectors).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# Labels every metric of the running agent carries (``node``); set by the runner around each gather,
# so collectors never have to thread them through.
CONST_LABELS: contextvars.ContextVar[tuple[tuple[str, ...], tuple[str, ...]]] = contextvars.ContextVar(
    "const_labels", default=((), ())
)


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _format_value(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (_INF, _NINF):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


_LABEL_CACHE: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
_INF, _NINF = float("inf"), float("-inf")


def render(metrics: Iterable[Metric]) -> bytes:
    """Prometheus text format (0.0.4) for metric families, the samples prometheus_client's
    ``generate_latest`` gives for the same families (tests/exporters/test_exporter_render.py checks it).

    ``generate_latest`` re-validates and re-escapes every label name of every sample (about 15 µs a
    sample here); a node scrape has ~2,000 samples and a 25 ms CPU budget, and a 20,000-port fabric
    220,000. So the label text is built once per label set: label sets hardly change between scrapes
    (cached by names and values), and within one rendering a dict of labels shared by several samples
    (a fabric port's, in every port family) is looked up once (by identity: the families are held
    alive for the whole call). Counters are named ``<family>_total`` as ``generate_latest`` names them;
    values are Python's shortest repr (``4e+06`` there is ``4000000.0`` here: the same number).
    """
    families = list(metrics)  # keeps every labels dict alive, so that ids stay unique in this call
    out: list[str] = []
    cache = _LABEL_CACHE
    if len(cache) > 500_000:  # label sets come and go (jobs, devices): start afresh now and then
        cache.clear()
    by_id: dict[int, str] = {}
    for metric in families:
        name = metric.name + "_total" if metric.type == "counter" else metric.name
        doc = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {metric.type}\n")
        for sample in metric.samples:
            labels = sample.labels
            value = sample.value
            text = _format_value(value) if (value != value or value in (_INF, _NINF)) else repr(float(value))
            if not labels:
                out.append(f"{sample.name} {text}\n")
                continue
            inner = by_id.get(id(labels))
            if inner is None:
                key = (tuple(labels), tuple(labels.values()))
                inner = cache.get(key)
                if inner is None:
                    inner = cache[key] = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                by_id[id(labels)] = inner
            out.append(f"{sample.name}{{{inner}}} {text}\n")
    return "".join(out).encode()


class Family:
    """A prometheus_client metric family (``GaugeMetricFamily`` or ``CounterMetricFamily``, through their
    public ``add_metric``) whose samples carry the runner's constant labels (``node``) first."""

    def __init__(
        self, family: GaugeMetricFamily | CounterMetricFamily, const_values: tuple[str, ...]
    ) -> None:
        self.family = family
        self.const_values = const_values

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self.family.add_metric([*self.const_values, *labels], value)


class SummedFamily(Family):
    """Samples with equal labels add up (aggregating over targets); written out by :meth:`finish`."""

    def __init__(
        self, family: GaugeMetricFamily | CounterMetricFamily, const_values: tuple[str, ...]
    ) -> None:
        super().__init__(family, const_values)
        self.totals: dict[tuple[str, ...], float] = {}

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        key = tuple(labels)
        self.totals[key] = self.totals.get(key, 0.0) + value

    def finish(self) -> None:
        for key, total in self.totals.items():
            super().add_metric(key, total)
        self.totals = {}


class Families:
    """Metric families built lazily by name, so a collector only declares what it emits; each carries
    the runner's constant labels (``node``) in front of its own. Counter names are given without
    ``_total`` (prometheus_client adds it)."""

    def __init__(self) -> None:
        self._families: dict[str, Family] = {}
        self.const_names, self.const_values = CONST_LABELS.get()

    def _family(self, name: str, doc: str, labels: Sequence[str], kind: str, cls: type[Family]) -> Family:
        family = self._families.get(name)
        if family is None:
            labelnames = [*self.const_names, *labels]
            if kind == "counter":
                inner: GaugeMetricFamily | CounterMetricFamily = CounterMetricFamily(
                    name, doc, labels=labelnames
                )
            else:
                inner = GaugeMetricFamily(name, doc, labels=labelnames)
            family = self._families[name] = cls(inner, self.const_values)
        return family

    def gauge(self, name: str, doc: str, labels: Sequence[str]) -> Family:
        return self._family(name, doc, labels, "gauge", Family)

    def counter(self, name: str, doc: str, labels: Sequence[str]) -> Family:
        return self._family(name, doc, labels, "counter", Family)

    def summed(self, name: str, doc: str, labels: Sequence[str], kind: str = "counter") -> Family:
        """A family whose samples with equal labels add up (aggregating over targets); a name ending
        in a unit without ``_total`` semantics (gauges) passes ``kind="gauge"``."""
        return self._family(name, doc, labels, kind, SummedFamily)

    def all(self) -> list[Metric]:
        for family in self._families.values():
            if isinstance(family, SummedFamily):
                family.finish()
        return [family.family for family in self._families.values()]
