"""How an answer becomes the window's arrays (anomaly/vectors.py): the columns (Vector) fill the window as
the samples would one by one, in order (a cell named twice keeps its last finite value, a text that
is not a number is missing, a counter that is not finite counts as 0), and an answer read straight off
its bytes gives the same columns as the same answer decoded as JSON."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import ClassVar
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from anomaly.source import PrometheusSource
from anomaly.vectors import gpu_values, node_values, window_from_values


def sample(node: str, gpu: int | None, value: str) -> dict:
    labels = {"node": node} if gpu is None else {"gpu": str(gpu), "node": node}
    return {"metric": labels, "value": [1.8e9, value]}


def test_the_columns_fill_the_window_as_the_samples_did_in_order() -> None:
    tensor = gpu_values([sample("b", 0, "0.5"), sample("a", 1, "0.25"), sample("a", 0, "0.75")])
    clock = gpu_values(
        [
            sample("a", 0, "1900"),
            sample("a", 0, "1950"),  # named twice: the last value stays
            sample("a", 1, "1800"),
            sample("a", 1, "NaN"),  # not finite: the earlier value stays
            sample("b", 0, "not a number"),  # missing
            sample("b", 1, "+Inf"),
            sample("c", 0, "1700"),  # a node without tensor or power: not in the window
            sample("b", 7, "1600"),  # a GPU beyond the window's: ignored
        ]
    )
    errors = node_values([sample("a", None, "3"), sample("a", None, "4"), sample("b", None, "NaN")])
    window = window_from_values(
        1.8e9, {"tensor": tensor, "sm_clock": clock}, {"ib_errors": errors}, None, None, []
    )
    assert window.nodes == ["a", "b"] and window.gpus == 2
    np.testing.assert_array_equal(window.tensor, [[0.75, 0.25], [0.5, np.nan]])
    np.testing.assert_array_equal(window.sm_clock, [[1950.0, 1800.0], [np.nan, np.nan]])
    np.testing.assert_array_equal(window.ib_errors, [4.0, 0.0])
    assert not window.jobs


def test_an_empty_answer_is_an_empty_window() -> None:
    window = window_from_values(
        1.8e9, {"tensor": gpu_values([])}, {"ib_errors": node_values([])}, None, None, []
    )
    assert window.nodes == [] and window.gpus == 1 and window.tensor.shape == (0, 1)


class Answers(http.server.BaseHTTPRequestHandler):
    """A Prometheus query API that answers a fixed body per query (the body's text is the test)."""

    bodies: ClassVar[dict[str, bytes]] = {}

    def do_GET(self) -> None:
        query = parse_qs(urlparse(self.path).query)["query"][0]
        body = self.bodies[query]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answers() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_bytes_and_the_json_read_the_same_columns(answers: str) -> None:
    per_gpu = [
        sample(f"nö{n}", g, text) for n in range(3) for g in range(2) for text in ("0.1234567890123", "NaN")
    ]
    per_gpu.append(sample("", 0, "+Inf"))  # no node: left out either way
    per_node = [sample(f"nö{n}", None, f"{n}e3") for n in range(3)]
    result = {"status": "success", "data": {"resultType": "vector", "result": None}}
    for name, samples in (("gpu", per_gpu), ("node", per_node)):
        result["data"]["result"] = samples
        compact = json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode()
        Answers.bodies[f"{name}_compact"] = compact
        Answers.bodies[f"{name}_spaced"] = json.dumps(result).encode()  # not the compact form: JSON
    source = PrometheusSource(answers)
    try:
        for name, per in (("gpu", True), ("node", False)):
            fast = source.query_values(f"{name}_compact", 1.8e9, per_gpu=per)
            slow = source.query_values(f"{name}_spaced", 1.8e9, per_gpu=per)
            assert fast.nodes == slow.nodes and len(fast) == (len(per_gpu) - 1 if per else len(per_node))
            np.testing.assert_array_equal(fast.gpus, slow.gpus)
            np.testing.assert_array_equal(fast.values, slow.values)
    finally:
        source.close()
