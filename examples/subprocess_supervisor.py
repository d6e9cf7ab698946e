"""A supervisor of its own, with fsm_agent deciding what to do: no torch agent, no torchrun.

The supervisor starts its workers with ``subprocess``, and a ``Driver`` of seven small methods
tells the ``Lifecycle`` what it sees; the spec (``torchelastic`` by default) decides when to
restart, when to give up and what to run on the way. Every transition is printed and, with
``--trace FILE``, written as a trace that ``fsm-agent replay FILE`` checks::

    python examples/subprocess_supervisor.py --workers 3 --fail-once --trace run.jsonl
    fsm-agent replay run.jsonl

``make_supervisor`` is how this supervisor builds its ``Lifecycle``; the conformance kit checks
it against the spec (``fsm-agent conformance examples.subprocess_supervisor:make_supervisor``).

Exit status: 0 when the workers succeeded, 1 when the lifecycle gave up, 2 on bad arguments,
130 on Ctrl-C (the workers are stopped first).
The worker is this file run with ``--worker``: it sleeps a little, and with ``--fail-once`` the
last worker exits with code 3 on the first attempt (``ATTEMPT=0``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

import fsm_agent
from fsm_agent.trace import open_trace

# How long a worker works (a test makes it longer, to interrupt the supervisor meanwhile).
WORKER_SECONDS = float(os.environ.get("WORKER_SECONDS", "0.3"))


class SubprocessDriver:
    """A ``fsm_agent.Driver``: one node, ``n`` local worker processes."""

    def __init__(self, n: int, fail_once: bool, always_fail: bool) -> None:
        self.n = n
        self.fail_once = fail_once
        self.always_fail = always_fail
        self.attempt = -1
        self.procs: list[subprocess.Popen[bytes]] = []

    def rendezvous(self) -> None:
        # One node: a round is just the next attempt. A multi-node supervisor would agree on
        # ranks and world size with its peers here.
        self.attempt += 1

    def start_workers(self) -> None:
        failing = self.always_fail or (self.fail_once and self.attempt == 0)
        self.procs = []
        for rank in range(self.n):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(self.n),
                   "ATTEMPT": str(self.attempt),
                   "FAIL": "1" if failing and rank == self.n - 1 else "0"}
            self.procs.append(subprocess.Popen([sys.executable, __file__, "--worker"], env=env))

    def stop_workers(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def monitor(self) -> Any:
        codes = [p.poll() for p in self.procs]
        failures = {rank: code for rank, code in enumerate(codes) if code not in (None, 0)}
        if failures:
            state = fsm_agent.WorkerState.FAILED
        elif all(code == 0 for code in codes):
            state = fsm_agent.WorkerState.SUCCEEDED
        else:
            state = fsm_agent.WorkerState.HEALTHY
        return fsm_agent.RunResult(state=state, failures=failures)

    def num_nodes_waiting(self) -> int:
        return 0  # one node: nobody ever waits to join

    def exit_barrier(self, timeout: float) -> None:
        pass  # one node: nobody to wait for

    def put_metric(self, name: str, value: int) -> None:
        pass  # a real supervisor would publish these (Prometheus, StatsD, ...)


def print_step(step: fsm_agent.Step) -> None:
    actions = ", ".join(a.name for a in step.actions)
    if step.source == step.dest and not actions:
        return  # a quiet tick
    print(f"{step.source} --{step.trigger}--> {step.dest}" + (f"  / {actions}" if actions else ""),
          flush=True)


def make_supervisor(driver: fsm_agent.Driver, *, spec: str | fsm_agent.Spec = "torchelastic",
                    **settings: Any) -> fsm_agent.Lifecycle:
    """The supervisor's lifecycle around ``driver`` (a conformance target: the kit passes its
    own driver and ``max_restarts``, ``role``, ``exit_barrier_timeout``)."""
    # One node: nobody to wait for at the exit barrier, unless the caller says otherwise.
    return fsm_agent.Lifecycle(spec, driver, **{"exit_barrier_timeout": 0, **settings})


def supervise(args: argparse.Namespace) -> int:
    driver = SubprocessDriver(args.workers, args.fail_once, args.always_fail)
    spec = fsm_agent.load_spec(args.spec)
    listeners: list[fsm_agent.Listener] = [print_step]
    trace = open_trace(args.trace, spec=spec, node="local") if args.trace else None
    if trace is not None:
        listeners.append(trace)
    lifecycle = make_supervisor(driver, spec=spec, max_restarts=args.max_restarts,
                                listeners=listeners)
    try:
        result = lifecycle.run(monitor_interval=0.05)
    except fsm_agent.WorkerGroupFailureException as e:  # the torchelastic preset gives up so
        print(f"gave up: {e} (failed ranks: {sorted(e.failures)})")
        return 1
    except KeyboardInterrupt:
        print("interrupted; workers stopped")
        return 130
    finally:
        driver.stop_workers()  # nothing is left running, whatever happened
        if trace is not None:
            trace.close()
    print(f"result: {result.state.name} after {lifecycle.restart_count} restart(s)")
    return 0 if result.state.name == "SUCCEEDED" else 1


def worker() -> int:
    time.sleep(WORKER_SECONDS)
    return 3 if os.environ.get("FAIL") == "1" else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-restarts", type=int, default=1)
    parser.add_argument("--spec", default="torchelastic")
    parser.add_argument("--fail-once", action="store_true",
                        help="the last worker fails on the first attempt")
    parser.add_argument("--always-fail", action="store_true",
                        help="the last worker fails on every attempt")
    parser.add_argument("--trace", metavar="FILE")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker()
    return supervise(args)


if __name__ == "__main__":
    sys.exit(main())
