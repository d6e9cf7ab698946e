"""Run torchrun or fsm-agent in this process with identical timing probes around the agent.

    python bench/_probe.py torchrun <torchrun args...>
    python bench/_probe.py fsm-agent run <fsm-agent run args...>

The probes wrap torch's own agent methods (on the classes, so a subclass that calls them is
timed the same way) and write one JSON line per call to ``$BENCH_EVENTS`` (a file per agent
process). They change no behaviour: each wrapper calls the original and records
``time.monotonic()`` before and after. Recorded: ``_monitor_workers`` calls that observed a
non-HEALTHY state (the agent's failure observation), ``_stop_workers``, ``_rendezvous``,
``_start_workers``, the exit barrier (``torch.distributed.elastic.utils.store.barrier``), the
rendezvous backend's store round trips, and the rendezvous' own polling sleeps; with
``BENCH_STORE_REQS=1`` every store request the agent makes.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

_OUT = os.environ.get("BENCH_EVENTS")
_LOCK = threading.Lock()
_FD: int | None = None


def _emit(name: str, t0: float, t1: float, **extra: Any) -> None:
    global _FD
    if _OUT is None:
        return
    rec = {"pid": os.getpid(), "name": name, "t0": t0, "t1": t1, **extra}
    with _LOCK:
        if _FD is None:
            _FD = os.open(_OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(_FD, (json.dumps(rec) + "\n").encode())


def _wrap(owner: Any, attr: str, name: str, result_info: Callable[[Any], dict[str, Any] | None]
          | None = None) -> None:
    original = owner.__dict__[attr]

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        try:
            out = original(*args, **kwargs)
        except BaseException as exc:
            _emit(name, t0, time.monotonic(), error=type(exc).__name__)
            raise
        t1 = time.monotonic()
        if result_info is None:
            _emit(name, t0, t1)
        else:
            info = result_info(out)
            if info is not None:
                _emit(name, t0, t1, **info)
        return out

    setattr(owner, attr, timed)


def _observed(result: Any) -> dict[str, Any] | None:
    state = getattr(getattr(result, "state", None), "name", None)
    if state in (None, "HEALTHY"):
        return None  # every tick: too many to log, and not what is timed
    return {"state": state}


def install() -> None:
    import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as c10d_backend
    import torch.distributed.elastic.rendezvous.dynamic_rendezvous as dyn
    import torch.distributed.elastic.utils.store as store_util
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    _wrap(LocalElasticAgent, "_monitor_workers", "observe", _observed)
    _wrap(LocalElasticAgent, "_stop_workers", "stop_workers")
    _wrap(LocalElasticAgent, "_start_workers", "start_workers")
    _wrap(SimpleElasticAgent, "_rendezvous", "rendezvous")
    _wrap(SimpleElasticAgent, "_assign_worker_ranks", "assign_ranks")
    original_barrier = store_util.barrier

    @functools.wraps(original_barrier)
    def barrier(*args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        try:
            return original_barrier(*args, **kwargs)
        finally:
            _emit("exit_barrier", t0, time.monotonic())

    store_util.barrier = barrier
    _wrap(c10d_backend.C10dRendezvousBackend, "get_state", "store_get_state")
    _wrap(c10d_backend.C10dRendezvousBackend, "set_state", "store_set_state")
    original_delay = dyn._delay

    def delay(seconds: Any) -> None:
        t0 = time.monotonic()
        original_delay(seconds)
        _emit("rdzv_delay", t0, time.monotonic(), asked=seconds)

    dyn._delay = delay


_STORE_METHODS = ("get", "set", "add", "check", "wait", "compare_set", "multi_get", "multi_set",
                  "delete_key", "num_keys", "append", "queue_push", "queue_pop")


def _count_store_requests() -> None:
    """One ``store_req`` event per request the agent makes to a store (``BENCH_STORE_REQS=1``).

    ``PrefixStore`` forwards to the store below it inside C++, so each Python-level call on
    either class is one request to the server.
    """
    import torch.distributed as dist

    for cls in (dist.TCPStore, dist.PrefixStore):
        for name in _STORE_METHODS:
            original = getattr(cls, name, None)
            if original is None:
                continue

            def call(self: Any, *args: Any, _original: Any = original, _name: str = name,
                     **kwargs: Any) -> Any:
                t = time.monotonic()
                _emit("store_req", t, t, op=_name)
                return _original(self, *args, **kwargs)

            setattr(cls, name, call)


def _install_fsm() -> None:
    # fsm-agent's exit barrier may be its own (same keys as torch's); time it the same way.
    # Only for fsm-agent: importing fsm_agent into torchrun's process would change what it runs.
    try:
        import fsm_agent.torch._barrier as fsm_barrier
    except ImportError:
        return
    for name in ("interruptible_barrier",):
        original = getattr(fsm_barrier, name, None)
        if not callable(original):
            continue

        def timed(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            t0 = time.monotonic()
            try:
                return _original(*args, **kwargs)
            finally:
                _emit("exit_barrier", t0, time.monotonic())

        setattr(fsm_barrier, name, timed)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("torchrun", "fsm-agent"):
        print("usage: _probe.py torchrun|fsm-agent ARGS...", file=sys.stderr)
        return 2
    if sys.argv[1:3] == ["fsm-agent", "run"]:
        # what `fsm-agent run --preload` does before it imports torch, which install() does here
        from fsm_agent.cli._prestart import prestart_template

        prestart_template(sys.argv[3:])
    install()
    if os.environ.get("BENCH_STORE_REQS") == "1":
        _count_store_requests()
    _emit("agent_start", time.monotonic(), time.monotonic())
    if sys.argv[1] == "fsm-agent":
        _install_fsm()
    if sys.argv[1] == "torchrun":
        from torch.distributed.run import main as torchrun_main

        sys.argv = ["torchrun", *sys.argv[2:]]
        torchrun_main()
        return 0
    from fsm_agent.cli import main as fsm_main

    return int(fsm_main(sys.argv[2:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
