"""The silent-corruption check (anomaly/sdc.py) on synthetic training records, built here independently
of the twin: replicas with noise, an injected drift on one replica, an ordinary spike that recovers, a
NaN, and records it cannot read. The twin's own runs are tests/twin/test_twin_sdc.py and the evaluation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anomaly.sdc import Record, SdcDetector, SdcInputError, detect
from anomaly.sdc_records import from_document, parse_line, parse_lines


def run(
    steps: int = 400,
    replicas: int = 4,
    seed: int = 0,
    corrupt: tuple[int, int, float] | None = None,  # (replica, first step, gradient error)
    spike: tuple[int, int, float, float] | None = None,  # (first step, bad replica, peak, half-life)
    nan_at: int | None = None,
    job_wide: bool = True,
) -> list[Record]:
    """Loss falling as a power law; per step a shared noise and a noise per replica (1 % loss, 4 % grad);
    the job-wide line every 10 steps, the mean of the replicas."""
    rng = np.random.default_rng(seed)
    records = []
    excess = 0.0
    for step in range(1, steps + 1):
        base = 1.9 + 8.9 * step**-0.35
        loss = base * (1 + rng.normal(0, 0.01)) * (1 + rng.normal(0, 0.01, replicas))
        grad = 0.8 * (1 + rng.normal(0, 0.05)) * (1 + rng.normal(0, 0.04, replicas))
        if spike and step >= spike[0]:
            first, bad, peak, half = spike
            excess = math.log(peak) if step == first else excess * 0.5 ** (1 / half)
            loss, grad = loss * math.exp(excess), grad * math.exp(3 * excess)
            if step == first:
                loss[bad] *= peak
                grad[bad] *= peak**3
        if corrupt and step >= corrupt[1]:
            loss[corrupt[0]] *= 1 + corrupt[2] / 4
            grad[corrupt[0]] *= 1 + corrupt[2]
        for r in range(replicas):
            records.append(Record(step, float(loss[r]), float(grad[r]), r, f"n{r + 1:04d}"))
        if job_wide and step % 10 == 0:
            value = math.nan if step == nan_at else float(loss.mean())
            records.append(Record(step, value, float(grad.mean())))
    return records


def test_an_injected_drift_is_caught_within_ten_steps_and_names_its_replica() -> None:
    verdict = detect(run(corrupt=(2, 300, 0.2)), "4101")
    assert verdict.flagged and verdict.reason == "replicas_disagree"
    assert 300 <= verdict.step <= 310, verdict.step
    assert [(s.replica, s.node) for s in verdict.suspects] == [(2, "n0003")]
    assert "NaN" not in verdict.reason and all(math.isfinite(r.loss) for r in run(corrupt=(2, 300, 0.2)))


def test_with_three_replicas_the_odd_one_is_named_not_the_two_it_drags() -> None:
    for seed in range(5):
        verdict = detect(run(replicas=3, seed=seed, corrupt=(1, 250, 0.8)), "j")
        assert verdict.flagged and verdict.step <= 260
        assert [s.replica for s in verdict.suspects] == [1], (seed, verdict.as_dict())


def test_an_ordinary_spike_that_recovers_is_not_flagged() -> None:
    for seed, (peak, half) in enumerate(((1.5, 1.0), (2.0, 3.0), (3.0, 6.0), (1.2, 10.0))):
        records = run(seed=seed, spike=(200, seed % 4, peak, half))
        assert max(r.loss for r in records if r.step == 200) > 1.3 * max(
            r.loss for r in records if r.step == 199
        )
        verdict = detect(records, "j")
        assert not verdict.flagged, (peak, half, verdict.as_dict())


def test_a_long_healthy_run_is_not_flagged() -> None:
    for seed in range(6):
        verdict = detect(run(steps=2000, replicas=3 + seed, seed=100 + seed), "j")
        assert not verdict.flagged, verdict.as_dict()
        assert verdict.steps == 2000 and verdict.replicas == 3 + seed


def test_the_same_drift_without_replica_lines_needs_the_job_trend_and_a_nan_also_flags() -> None:
    """Job-wide records only: a small error on one replica of four barely moves the mean (not flagged);
    a large one is a lasting level shift of the gradient norm (flagged, no replica named). A NaN flags
    at once, but as one trigger among others."""
    small = [r for r in run(steps=600, corrupt=(2, 300, 0.2)) if r.replica is None]
    assert not detect(small, "j").flagged
    large = [r for r in run(steps=800, corrupt=(2, 300, 3.0)) if r.replica is None]
    verdict = detect(large, "j")
    assert verdict.flagged and verdict.reason == "job_trend" and verdict.suspects == []
    assert verdict.step > 300
    nan = detect(run(nan_at=250), "j")
    assert nan.flagged and nan.reason == "nonfinite_loss" and nan.step == 250


def test_two_replicas_cannot_name_one_and_the_streaming_form_agrees() -> None:
    records = run(replicas=2, corrupt=(1, 300, 0.3))
    two = detect(records, "j")
    assert two.suspects == [] and two.notes and "two replicas" in two.notes[0]
    detector = SdcDetector("j")
    steps = sorted({r.step for r in run(corrupt=(0, 300, 0.5))})
    by_step = {s: [r for r in run(corrupt=(0, 300, 0.5)) if r.step == s] for s in steps}
    first = next(s for s in steps if detector.add(s, by_step[s]))
    assert first == detect(run(corrupt=(0, 300, 0.5)), "j").step


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([], "no training records"),
        ([Record(-1, 1.0)], "not a non-negative integer"),
        ([Record(1.5, 1.0)], "not a non-negative integer"),  # type: ignore[arg-type]
        ([Record(1, "2.3")], "loss '2.3' is not a number"),  # type: ignore[arg-type]
        ([Record(1, 2.0, None, -2)], "replica -2"),
        (["step=1 loss=2"], "expected a Record"),
        ("not a list", "expected a list"),
    ],
)
def test_bad_or_missing_records_are_a_clear_error(records: object, message: str) -> None:
    with pytest.raises(SdcInputError, match=message):
        detect(records, "j")  # type: ignore[arg-type]


def test_the_readers_take_megatron_key_value_and_indexed_forms() -> None:
    megatron = (
        "[2026-11-21 10:01:30] iteration      100/ 2000000 | consumed samples:        12800 | elapsed "
        "time per iteration (ms): 4098.4 | learning rate: 2.994E-04 | global batch size:   128 | lm loss: "
        "2.531043E+00 | loss scale: 1.0 | grad norm: 0.753 | number of skipped iterations:   0 |"
    )
    assert parse_line(megatron, "n0003") == Record(100, 2.531043, 0.753, None, "n0003")
    replica = (
        "[2026-11-21 10:01:30] fleetsight-train step=7 replica=3 node=n0007 loss=2.5 grad_norm=0.8 "
        "step_time_ms=9"
    )
    assert parse_line(replica) == Record(7, 2.5, 0.8, 3, "n0007")
    assert math.isnan(parse_line("step=9 loss=NaN").loss)
    assert parse_line("NCCL INFO comm 0x1 rank 5") is None
    assert len(parse_lines([megatron, megatron, replica])) == 2  # every rank logs the job-wide line
    indexed = {
        "training": {"step": 7, "loss": 2.5, "grad_norm": 0.8, "replica": 3},
        "host": {"name": "n0007"},
    }
    assert from_document(indexed) == Record(7, 2.5, 0.8, 3, "n0007")
    assert math.isnan(from_document({"training": {"step": 8, "loss_finite": False, "loss_text": "nan"}}).loss)
    assert from_document({"message": "no step"}) is None
    with pytest.raises(SdcInputError, match=r"training\.loss 'x' is not a number"):
        from_document({"training": {"step": 8, "loss": "x"}})
    with pytest.raises(SdcInputError, match="is not a step"):
        from_document({"training.step": "eight"})
