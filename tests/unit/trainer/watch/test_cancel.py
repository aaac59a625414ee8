"""A SIGTERM to a rank is a request to stop at the next step boundary, agreed by every rank (one rank here: its own
answer); train.save_every_minutes says when rank 0's clock makes a save due."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from trainer.parallel.distributed import Dist
from trainer.watch.cancel import CancelWatch, SaveClock

ONE = Dist(0, 0, 1, 0, "host", torch.device("cpu"))


@pytest.fixture
def sigterm_restored():
    assert threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_sigterm_asks_every_rank_to_stop_at_the_next_step(sigterm_restored) -> None:
    watch = CancelWatch(enabled=True)
    assert not watch.should_stop(ONE) and watch.seconds_since_signal() is None
    os.kill(os.getpid(), signal.SIGTERM)  # the handler sets a flag: the process goes on
    deadline = time.monotonic() + 5
    while not watch.requested and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watch.should_stop(ONE) and 0 <= watch.seconds_since_signal() < 5


def test_off_it_leaves_sigterm_alone(sigterm_restored) -> None:
    before = signal.getsignal(signal.SIGTERM)
    watch = CancelWatch(enabled=False)
    watch.requested = True
    assert signal.getsignal(signal.SIGTERM) is before and not watch.should_stop(ONE)


def test_a_save_is_due_once_the_interval_passed_since_the_last() -> None:
    assert not SaveClock(None).due(ONE)
    clock = SaveClock(0.002)  # 0.12 s
    assert not clock.due(ONE)
    time.sleep(0.15)
    assert clock.due(ONE)
    clock.saved()
    assert not clock.due(ONE)
