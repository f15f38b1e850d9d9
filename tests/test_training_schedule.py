"""The trainers' learning-rate schedule (training/schedule.py): warm-up, then cosine decay over the
steps or, with `--minutes`, over the training time, which then also ends training."""

import math

import pytest
import torch

from training.schedule import Schedule, epochs_done


def test_by_steps_it_warms_up_then_decays_to_zero_and_never_stops_training():
    schedule = Schedule(lr=1.0, warmup=10, total_steps=100)
    assert schedule.rate(0) == pytest.approx(0.1 * 1.0)  # warm-up: (step + 1) / 10 of the cosine's value
    assert schedule.rate(9) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.09)))
    assert schedule.rate(50) == pytest.approx(0.5)
    assert schedule.rate(100) == pytest.approx(0.0, abs=1e-12)
    assert [schedule.rate(s) for s in range(10, 100)] == sorted([schedule.rate(s) for s in range(10, 100)],
                                                                reverse=True)
    assert not schedule.done(10**6)


def test_with_a_budget_it_follows_the_training_time_and_ends_when_it_is_spent():
    schedule = Schedule(lr=1.0, warmup=1, total_steps=10, minutes=2)
    assert schedule.progress(9) == 0.0 and not schedule.done(9)  # steps do not count, time does
    schedule.trained_seconds = 60.0
    assert schedule.progress(0) == pytest.approx(0.5) and schedule.rate(5) == pytest.approx(0.5)
    schedule.trained_seconds = 119.0
    assert not schedule.done(0)
    schedule.trained_seconds = 120.0
    assert schedule.done(0) and schedule.rate(0) == pytest.approx(0.0, abs=1e-12)


def test_only_the_steps_count_toward_the_budget():
    schedule = Schedule(lr=1.0, warmup=1, total_steps=10, minutes=1)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    assert schedule.begin_step(optimizer, 0) and optimizer.param_groups[0]["lr"] == pytest.approx(1.0)
    schedule.end_step()
    assert 0.0 <= schedule.trained_seconds < 1.0
    schedule.trained_seconds = 60.0
    assert not schedule.begin_step(optimizer, 1)  # spent: no step, the rate left as it was
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1.0)


def test_a_budget_cut_epoch_is_reported_as_a_fraction():
    assert epochs_done(2, 10, 10) == 3 and epochs_done(2, 4, 10) == 2.4
