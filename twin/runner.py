"""Runs a scenario: advances the simulation tick by tick, writes the per-node trees and logs, and
optionally serves the HTTP endpoints while it runs.

Speed: ``realtime`` paces one tick per tick of wall-clock time, a number paces that many times
faster, ``max`` does not pace at all. At max speed the file trees are rewritten only every
``write_every`` simulated seconds (default: once, at the end), because rewriting ~800 files per node
every 5 s is what makes the 1,024-node hour slow.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .scenario_model import Scenario
from .server import TwinServer
from .sim import Simulation
from .truth import check_outside as truth_mod_check
from .writers import TreeWriter

log = logging.getLogger("twin.run")


@dataclass
class RunOptions:
    out: Path
    speed: float | None  # None = max; 1.0 = real time
    serve: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    duration: float | None = None
    start: dt.datetime | None = None
    write_every: float | None = None
    linger: bool = True  # with --serve: keep serving the last state after the scenario ends
    truth: Path | None = None  # default: <out>.truth.jsonl beside OUT
    history: Path | None = None  # also cut the run's dcgm-exporter history into TSDB blocks here


@dataclass
class RunSummary:
    ticks: int
    sim_seconds: float
    wall_seconds: float
    files_written: int
    faults: int
    nodes: int
    url: str | None


def parse_speed(text: str) -> float | None:
    """`realtime` -> 1.0, `max` -> None, a number -> that factor."""
    if text == "realtime":
        return 1.0
    if text == "max":
        return None
    try:
        factor = float(text)
    except ValueError as exc:
        raise ValueError(f"--speed: expected realtime, max or a factor like 10; got {text!r}") from exc
    if factor <= 0:
        raise ValueError("--speed: the factor must be positive")
    return factor


class Runner:
    def __init__(self, scenario: Scenario, options: RunOptions) -> None:
        self.scenario = scenario
        self.options = options
        start = options.start
        if start is None:
            # Paced runs feed a live Prometheus: their clock is now. Max-speed runs are reproducible.
            start = (
                dt.datetime.now(dt.UTC).replace(microsecond=0)
                if options.speed is not None
                else scenario.start
            )
        self.sim = Simulation(scenario, start)
        self.writer = TreeWriter(options.out, self.sim, options.truth)
        self.lock = threading.RLock()
        self.server: TwinServer | None = None
        self.stop_event = threading.Event()

    def request_stop(self, *_: object) -> None:
        self.stop_event.set()

    def run(self, on_ready: callable | None = None) -> RunSummary:  # type: ignore[valid-type]
        options, sim, scenario = self.options, self.sim, self.scenario
        duration = options.duration if options.duration is not None else scenario.duration
        ticks = max(1, math.ceil(duration / scenario.tick))
        paced = options.speed is not None
        write_every = (
            options.write_every if options.write_every is not None else (scenario.tick if paced else duration)
        )
        write_ticks = max(1, round(write_every / scenario.tick))
        flush_ticks = 1 if paced else max(1, round(60.0 / scenario.tick))
        started = time.monotonic()
        recorder = None
        if options.history is not None:
            from .history import HistoryRecorder

            truth_mod_check(options.history, options.out)
            recorder = HistoryRecorder(sim, ticks)
        with self.lock:
            self.writer.create()
            sim.advance()
            if recorder is not None:
                recorder.record(sim)
            self.writer.write_state()
            self.writer.flush_logs()
        if options.serve:
            self.server = TwinServer(options.host, options.port, sim, self.lock)
            self.server.start()
            log.info("event=serving url=%s nodes=%d", self.server.base_url, len(sim.nodes))
        if on_ready is not None:
            on_ready(self)
        log.info(
            "event=run_start nodes=%d ticks=%d speed=%s out=%s truth=%s",
            len(sim.nodes),
            ticks,
            options.speed or "max",
            options.out,
            self.writer.truth_path,
        )
        wall0 = time.monotonic()
        done = 1
        while done < ticks and not self.stop_event.is_set():
            with self.lock:
                sim.advance()
                if recorder is not None:
                    recorder.record(sim)
                done += 1
                last = done == ticks
                if done % write_ticks == 0 or last:
                    self.writer.write_state()
                if done % flush_ticks == 0 or last:
                    self.writer.flush_logs()
            if paced:
                self._pace(wall0, done, scenario.tick / options.speed)
            if done % max(1, round(600 / scenario.tick)) == 0:
                log.info("event=progress sim_time=%s ticks=%d/%d", sim.iso(), done, ticks)
        with self.lock:
            self.writer.write_state()
            self.writer.flush_logs()
        if recorder is not None:
            from .history import cut_blocks

            series, samples, blocks = cut_blocks(sim, recorder.recorded(), options.history)
            log.info(
                "event=history_written blocks=%d series=%d samples=%d dir=%s",
                blocks,
                series,
                samples,
                options.history,
            )
        wall = time.monotonic() - started
        summary = RunSummary(
            ticks=done,
            sim_seconds=done * scenario.tick,
            wall_seconds=wall,
            files_written=self.writer.cache.writes,
            faults=len(sim.truth_lines),
            nodes=len(sim.nodes),
            url=self.server.base_url if self.server else None,
        )
        log.info(
            "event=run_end ticks=%d sim_seconds=%.0f wall_seconds=%.1f files_written=%d faults=%d",
            summary.ticks,
            summary.sim_seconds,
            summary.wall_seconds,
            summary.files_written,
            summary.faults,
        )
        if self.server is not None:
            if options.linger and not self.stop_event.is_set():
                log.info("event=scenario_over serving=last_state hint='stop with SIGTERM or Ctrl-C'")
                self.stop_event.wait()
            self.server.stop()
        return summary

    def _pace(self, wall0: float, done: int, seconds_per_tick: float) -> None:
        """Wait until this tick's wall-clock slot; report when the simulation falls behind."""
        due = wall0 + (done - 1) * seconds_per_tick
        late = time.monotonic() - due
        if late > seconds_per_tick:
            log.warning("event=behind_realtime seconds=%.2f tick=%d", late, done)
        self.stop_event.wait(max(0.0, due - time.monotonic()))


def install_signal_handlers(runner: Runner) -> None:
    signal.signal(signal.SIGTERM, runner.request_stop)
    signal.signal(signal.SIGINT, runner.request_stop)
