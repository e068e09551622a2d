"""The one Prometheus HTTP API client every component uses (anomaly, health, dashboards, evaluation):
instant and range queries, series, label values, rules, alerts and readiness, over httpx, synchronous.

Its own module because every component reaches Prometheus (or Thanos Query, which speaks the same API)
and each used to hand-roll the same calls with its own idea of what a failure is. Here a failure is one
of the typed exceptions below, all under :class:`PrometheusError`:

- :class:`PrometheusUnreachable` (and its :class:`PrometheusTimeout`): no answer at all;
- :class:`PrometheusQueryError`: Prometheus's own ``{"status": "error", "errorType", "error"}`` answer,
  whatever its HTTP status (400 bad_data, 422 execution, 503 unavailable...);
- :class:`PrometheusHTTPError`: a non-2xx answer that is not Prometheus's (a proxy's 503, a 404);
- :class:`PrometheusBadAnswer`: a 2xx answer that is not the JSON the API documents.

Credentials (basic auth, bearer token) may be given as files, read with fleetsight.secrets; TLS takes a
CA file or no verification. Long queries can go as a POST form (``post_over``): some proxies refuse a
URL of some 8 KiB. :meth:`Prometheus.query_columns` reads a large vector answer straight off its bytes
into columns, without decoding its JSON (the anomaly service reads ~100,000 samples per field).
"""

from __future__ import annotations

import functools
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .secrets import read_secret_file

# A time or a step: a number of seconds, or text Prometheus parses as it is (RFC 3339, a caller's rounding).
Time = float | str
# A label value in the compact form: no quote, no escape, not empty (anything else: the JSON path).
ANY_VALUE = rb'[^"\\]+'
DIGITS = rb"\d+"
_COMPACT_VECTOR = b'{"status":"success","data":{"resultType":"vector","result":['


class PrometheusError(RuntimeError):
    """Prometheus did not answer, or did not answer a result; the message names its URL."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"Prometheus at {url}: {message}")
        self.url = url


class PrometheusUnreachable(PrometheusError):
    """No answer: refused, reset, a name that does not resolve, a TLS failure."""


class PrometheusTimeout(PrometheusUnreachable):
    """No answer within the client's timeout."""


class PrometheusHTTPError(PrometheusError):
    """A non-2xx answer that is not Prometheus's error JSON (a proxy's, a wrong path's)."""

    def __init__(self, url: str, status: int, text: str) -> None:
        super().__init__(url, f"HTTP {status}: {text[:200]}")
        self.status = status


class PrometheusQueryError(PrometheusError):
    """Prometheus's own error answer (``"status": "error"``), e.g. bad_data for a PromQL syntax error."""

    def __init__(self, url: str, status: int, error_type: str, error: str) -> None:
        super().__init__(url, f"HTTP {status}: {error_type}: {error}")
        self.status, self.error_type, self.error = status, error_type, error


class PrometheusBadAnswer(PrometheusError):
    """A 2xx answer that is not the API's JSON, or not the result type asked for."""


@dataclass(frozen=True)
class Columns:
    """A vector answer as columns, read off its bytes: each sample's value of each label asked for, and
    each sample's value text, all as the answer's bytes (``float()`` and ``int()`` take them as they are)."""

    labels: dict[str, tuple[bytes, ...]]
    values: tuple[bytes, ...]

    def __len__(self) -> int:
        return len(self.values)

    def strings(self, label: str) -> list[str]:
        """One label's values as text, decoded in one call (a NUL cannot be in a JSON string unescaped)."""
        names = self.labels[label]
        return b"\0".join(names).decode().split("\0") if names else []


@functools.lru_cache(maxsize=16)
def _compact_sample(labels: tuple[tuple[str, bytes], ...]) -> re.Pattern[bytes]:
    """One sample as Prometheus and Thanos write it: exactly these labels, sorted, no spaces."""
    fields = b",".join(b'"' + re.escape(name.encode()) + b'":"(' + value + b')"' for name, value in labels)
    return re.compile(rb'\{"metric":\{' + fields + rb'\},"value":\[[^\],]*,"([^"]*)"\]\}')


def compact_columns(body: bytes, labels: Mapping[str, bytes]) -> Columns | None:
    """The columns of a successful vector answer whose every sample carries exactly ``labels`` (name ->
    regex its value must match, e.g. DIGITS), or None when any does not (decode the JSON instead)."""
    if not body.startswith(_COMPACT_VECTOR):
        return None
    names = sorted(labels)
    found = _compact_sample(tuple((name, labels[name]) for name in names)).findall(body)
    if len(found) != body.count(b'"metric":'):
        return None
    if len(names) == 0:  # findall gives the one group itself, not tuples
        return Columns({}, tuple(found))
    columns = list(zip(*found, strict=True)) if found else [()] * (len(names) + 1)
    return Columns(dict(zip(names, columns[:-1], strict=True)), tuple(columns[-1]))


def _tls(ca_file: str | Path | None, verify: bool) -> ssl.SSLContext | bool:
    if not verify:
        return False
    return ssl.create_default_context(cafile=str(ca_file)) if ca_file else True


class Prometheus:
    """One Prometheus (or Thanos Query) HTTP API at ``url``. ``post_over``: queries longer than this many
    characters go as a POST form (0: every query; None: none). ``headers``: sent with every request (e.g.
    ``Accept-Encoding: identity``). Credentials: basic auth or a bearer token, each given or as a file."""

    def __init__(
        self,
        url: str,
        timeout: float = 10.0,
        *,
        headers: Mapping[str, str] | None = None,
        post_over: int | None = None,
        username: str | None = None,
        password: str | None = None,
        password_file: str | Path | None = None,
        bearer_token: str | None = None,
        bearer_token_file: str | Path | None = None,
        ca_file: str | Path | None = None,
        verify: bool = True,
    ) -> None:
        self.url = url.rstrip("/")
        self.post_over = post_over
        sent = dict(headers or {})
        if bearer_token_file:
            bearer_token = read_secret_file(bearer_token_file, "Prometheus bearer token file")
        if bearer_token:
            sent["Authorization"] = f"Bearer {bearer_token}"
        if password_file:
            password = read_secret_file(password_file, "Prometheus password file")
        auth = httpx.BasicAuth(username, password or "") if username else None
        self.client = httpx.Client(timeout=timeout, headers=sent, auth=auth, verify=_tls(ca_file, verify))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------ the calls
    def query(self, promql: str, at: Time | None = None) -> list[dict[str, Any]]:
        """An instant query's vector: each sample's ``metric`` (labels) and ``value`` ([time, text])."""
        return self._result(self.query_data(promql, at), "vector")

    def query_data(self, promql: str, at: Time | None = None) -> dict[str, Any]:
        """An instant query's ``data``, whatever its result type (vector, scalar, string, matrix)."""
        return self._data(self._query("/api/v1/query", promql, _params(time=at)))

    def query_range(self, promql: str, start: Time, end: Time, step: Time) -> list[dict[str, Any]]:
        """A range query's matrix: each series' ``metric`` and ``values`` ([[time, text], ...])."""
        params = _params(start=start, end=end, step=step)
        return self._result(self._data(self._query("/api/v1/query_range", promql, params)), "matrix")

    def query_columns(
        self, promql: str, labels: Mapping[str, bytes], at: Time | None = None
    ) -> Columns | list[dict[str, Any]]:
        """An instant vector as Columns when it is in the compact form with exactly ``labels``
        (compact_columns), else its decoded samples, as :meth:`query` gives them."""
        response = self._query("/api/v1/query", promql, _params(time=at))
        if response.status_code == 200:
            columns = compact_columns(response.content, labels)
            if columns is not None:
                return columns
        return self._result(self._data(response), "vector")

    def series(
        self, *matchers: str, start: Time | None = None, end: Time | None = None
    ) -> list[dict[str, str]]:
        """The label sets of the series any of ``matchers`` selects."""
        return self._data(
            self._get("/api/v1/series", {"match[]": list(matchers), **_params(start=start, end=end)})
        )

    def label_values(
        self, label: str, *matchers: str, start: Time | None = None, end: Time | None = None
    ) -> list[str]:
        """The values of ``label`` (on the series ``matchers`` select, if any)."""
        params = {"match[]": list(matchers), **_params(start=start, end=end)}
        return self._data(self._get(f"/api/v1/label/{label}/values", params))

    def rules(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The rule groups (``kind``: "alert" or "record" for one kind only)."""
        return self._data(self._get("/api/v1/rules", _params(type=kind))).get("groups", [])

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now, with their rendered annotations."""
        return self._data(self._get("/api/v1/alerts", {})).get("alerts", [])

    def ready(self) -> bool:
        """Whether ``/-/ready`` answers 200 (the TSDB loaded); False when nothing answers."""
        try:
            return self.client.get(f"{self.url}/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    # ------------------------------------------------------------------------------ the plumbing
    def _query(self, path: str, promql: str, params: dict[str, Any]) -> httpx.Response:
        params = {"query": promql, **params}
        if self.post_over is not None and len(promql) > self.post_over:
            return self._send("POST", path, data=params)
        return self._get(path, params)

    def _get(self, path: str, params: dict[str, Any]) -> httpx.Response:
        return self._send("GET", path, params=params)

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self.client.request(method, f"{self.url}{path}", **kwargs)
        except httpx.TimeoutException as exc:
            raise PrometheusTimeout(self.url, f"{type(exc).__name__}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise PrometheusUnreachable(self.url, f"{type(exc).__name__}: {exc}") from exc

    def _data(self, response: httpx.Response) -> Any:
        """The answer's ``data``, or the exception that says why there is none."""
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("status") == "error":
            error_type, error = str(body.get("errorType", "")), str(body.get("error", ""))
            raise PrometheusQueryError(self.url, response.status_code, error_type, error)
        if not response.is_success:
            raise PrometheusHTTPError(self.url, response.status_code, response.text)
        if not isinstance(body, dict) or body.get("status") != "success" or "data" not in body:
            raise PrometheusBadAnswer(self.url, f"HTTP {response.status_code}, not an API answer")
        return body["data"]

    def _result(self, data: Any, kind: str) -> list[dict[str, Any]]:
        if not isinstance(data, dict) or data.get("resultType") != kind:
            got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
            raise PrometheusBadAnswer(self.url, f"expected a {kind}, got {got}")
        return data.get("result") or []


def _params(**values: Time | None) -> dict[str, str]:
    """The given values as query parameters: numbers as ``str()`` writes them (as httpx would), text as it
    is."""
    return {name: str(value) for name, value in values.items() if value is not None}
