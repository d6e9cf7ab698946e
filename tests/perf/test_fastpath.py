"""fast_rendezvous, cheap_rendezvous_events: what they change, and that torch is restored."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest

dyn = pytest.importorskip("torch.distributed.elastic.rendezvous.dynamic_rendezvous")

from fsm_agent.torch._fastpath import (  # noqa: E402
    DEFAULT_SYNC_POLL,
    cheap_rendezvous_events,
    fast_rendezvous,
)


def _handler(max_nodes: int, cache: float = 1) -> Any:
    return SimpleNamespace(
        settings=SimpleNamespace(max_nodes=max_nodes),
        _state_holder=SimpleNamespace(_cache_duration=cache),
    )


@pytest.fixture
def delays(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    asked: list[object] = []
    monkeypatch.setattr(dyn, "_delay", lambda seconds: asked.append(seconds))
    return asked


def test_restart_skips_the_start_up_skew_and_polls_faster(delays: list[object]) -> None:
    handler = _handler(max_nodes=4)
    with fast_rendezvous(handler, first=False):
        dyn._delay((0, 0.3))  # what next_rendezvous asks for while state.round == 0
        dyn._delay(1)  # the join loop's poll
        assert handler._state_holder._cache_duration == DEFAULT_SYNC_POLL
    assert delays == [DEFAULT_SYNC_POLL]
    assert handler._state_holder._cache_duration == 1  # torch's cache is back for the ticks


def test_first_multi_node_join_keeps_torchs_skew(delays: list[object]) -> None:
    with fast_rendezvous(_handler(max_nodes=4), first=True):
        dyn._delay((0, 0.3))
    assert delays == [(0, 0.3)]


def test_single_node_never_skews(delays: list[object]) -> None:
    with fast_rendezvous(_handler(max_nodes=1), first=True):
        dyn._delay((0, 0.3))
    assert delays == []


def test_torchs_helpers_are_restored_even_on_error(delays: list[object]) -> None:
    before = (dyn._delay, dyn.get_method_name)
    with pytest.raises(RuntimeError), fast_rendezvous(_handler(max_nodes=2), first=False):
        assert dyn._delay is not before[0]
        raise RuntimeError("rendezvous failed")
    assert (dyn._delay, dyn.get_method_name) == before


def test_method_name_matches_torchs_own() -> None:
    original = dyn.get_method_name

    def _record() -> tuple[str, str]:
        with cheap_rendezvous_events():
            fast = dyn.get_method_name()
        return original(), fast

    def some_rendezvous_step() -> tuple[str, str]:
        return _record()

    slow, fast = some_rendezvous_step()
    assert slow == fast == "some_rendezvous_step"
    assert dyn.get_method_name is original
    assert "inspect.stack" in inspect.getsource(original)  # what is being replaced, still there
