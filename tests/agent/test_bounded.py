"""``fsm_agent.torch._bounded``: store calls that end within a timeout (the real partition is in
tests/reliability/test_partition.py); here the calls are plain functions that block."""

from __future__ import annotations

import signal
import threading
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from fsm_agent.torch._bounded import StoreCalls, StoreUnresponsive, timeout_of


def test_a_call_returns_its_value_and_raises_its_error() -> None:
    calls = StoreCalls(5.0)
    assert calls.call(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(KeyError, match="nope"):
        calls.call({}.__getitem__, "nope")
    assert calls.lost is None  # an error is an answer


def test_a_call_that_does_not_end_loses_the_store_for_every_later_call() -> None:
    calls = StoreCalls(0.2)
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(StoreUnresponsive, match=r"did not answer a wait within 0.2 s"):
        calls.call(release.wait)
    assert 0.2 <= time.monotonic() - started < 2
    with pytest.raises(StoreUnresponsive, match="a wait"):  # at once, naming the first call
        calls.call(lambda: 1)
    release.set()


def test_a_signal_handler_runs_while_a_call_waits() -> None:
    calls = StoreCalls(30.0)
    release = threading.Event()

    class Raised(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        raise Raised

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    started = time.monotonic()
    try:
        with pytest.raises(Raised):
            calls.call(release.wait)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        release.set()
    assert time.monotonic() - started < 2


def test_a_wrapped_store_calls_through_and_keeps_its_attributes() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=7))
    assert timeout_of(store) == 7
    bounded = StoreCalls(7).wrap(store)
    bounded.set("k", "v")
    assert bounded.get("k") == b"v" and bounded.check(["k"])
    assert bounded.timeout == timedelta(seconds=7)
    assert timeout_of(object()) is None
