"""A deterministic simulation of one job of N agents over the real engine.

Each agent is a real ``fsm_agent.Lifecycle`` of a preset spec, driven by a simulated driver;
all of them share one ``MemoryStore`` (TCPStore's semantics) through ``fsm_agent._core._job
.JobChannel``, exactly as the torch agents share the rendezvous store. What torch provides is
simulated: the c10d rendezvous (a round completes when every node has joined), the exit barrier,
the workers (scripted per round: all succeed, or some fail at given times) and faults (an agent
crashes, the store's host dies).

Determinism: every agent runs on its own thread, but only one runs at a time. An agent runs
until it waits (a monitor interval, a poll in the rendezvous or the barrier); then the scheduler
picks the next agent whose wait is over, in virtual time, by asking ``choose`` (hypothesis draws
the interleaving). Nothing reads the real clock.

The agents' glue mirrors ``fsm_agent.torch``'s: polls at ``POLL`` wherever they wait,
``job_failed`` returned by the monitor wait, ``JobOver`` raised in the rendezvous, the exit
barrier ended by an announcement, the announcement of an action error, the linger for
acknowledgements, the exit code of the job's outcome.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import attrs

from fsm_agent import ActionError, Lifecycle, LifecycleError, WorkerGroupFailureException
from fsm_agent._core._job import (
    JOB_FAILED,
    LINGER_TIMEOUT,
    JobChannel,
    JobOutcome,
    JobOver,
    MemoryStore,
)
from fsm_agent.testing import make_result

# Virtual seconds. The poll and the tick are coarser than the torch agent's (0.2 s, 0.1 s) to keep
# runs short; what is checked (one outcome, the budget, every agent ends, within a linger of the
# announcement) does not depend on their size, only on polls being shorter than timeouts.
POLL = 1.0
MONITOR_INTERVAL = 1.0
JOIN_TIMEOUT = 600.0
BARRIER_TIMEOUT = 300.0
HORIZON = 3600.0  # a run still going then is stuck
# SPMD: once a rank of the round failed or its node died, the others' collectives fail too.
COLLECTIVE_TIMEOUT = 30.0


class Crashed(BaseException):
    """Raised inside an agent's thread when the scheduler kills it (SIGKILL)."""


@attrs.define
class RoundPlan:
    """How the workers of one rendezvous round end."""

    succeed_at: float | None = None  # every worker succeeds then (SPMD: all or none)
    fail_at: dict[int, float] = attrs.field(factory=dict)  # agent -> when its workers fail


@attrs.define
class Faults:
    crash: dict[int, float] = attrs.field(factory=dict)  # agent -> when it is killed
    store_dies_at: float | None = None


class Scheduler:
    """Runs agent threads one at a time in virtual time."""

    def __init__(self, choose: Callable[[int], int]) -> None:
        self.choose = choose
        self.now = 0.0
        self._back = threading.Semaphore(0)
        self.steps = 0

    def block(self, agent: SimAgent, until: float | None,
              ready: Callable[[], bool] | None = None) -> None:
        """From an agent's thread: let the others run until ``ready()`` or ``until``."""
        agent.until, agent.ready = until, ready
        self._back.release()
        agent.resume.acquire()
        if agent.killed:
            raise Crashed()

    def sleep(self, agent: SimAgent, seconds: float) -> None:
        self.block(agent, self.now + max(0.0, seconds))

    def run(self, agents: list[SimAgent], faults: Faults, on_time: Callable[[], None]) -> bool:
        """Run until every agent has ended; False if stuck (deadlock or past the horizon)."""
        for a in agents:
            a.thread.start()
            self._back.acquire()  # each blocks at once, ready to start
        pending_crash = dict(faults.crash)
        while True:
            on_time()
            for i, at in list(pending_crash.items()):
                if self.now >= at:
                    del pending_crash[i]
                    agents[i].kill()
            live = [a for a in agents if not a.ended]
            if not live:
                return True
            runnable = [a for a in live if a.killed or (a.ready is not None and a.ready())
                        or (a.until is not None and a.until <= self.now)]
            if not runnable:
                times = [a.until for a in live if a.until is not None]
                times += [t for t in pending_crash.values()]
                if faults.store_dies_at is not None and faults.store_dies_at > self.now:
                    times.append(faults.store_dies_at)
                if not times or min(times) > HORIZON:
                    for a in live:
                        a.kill()
                        a.resume.release()
                        self._back.acquire()
                    return False
                self.now = max(self.now, min(times))
                continue
            agent = runnable[self.choose(len(runnable)) % len(runnable)]
            self.steps += 1
            agent.resume.release()
            self._back.acquire()


class SimRendezvous:
    """c10d for a fixed --nnodes: a round completes when every node has joined."""

    def __init__(self, n: int, plans: Callable[[int], RoundPlan]) -> None:
        self.n = n
        self.round = 0
        self.members: set[int] = set()
        self.joined: set[int] = set()
        self.plans = plans
        self.plan = RoundPlan()
        self.started_at = 0.0
        self.failed = False  # something failed in the current round
        self.failed_at: float | None = None
        self.failure_restarts = 0  # rounds formed after a round in which something failed
        self.arrived: dict[int, set[int]] = {}

    def join(self, agent: int, now: float) -> None:
        self.joined.add(agent)
        if len(self.joined) == self.n:
            if self.round and self.failed:
                self.failure_restarts += 1
            self.round += 1
            self.members, self.joined = set(self.joined), set()
            self.plan = self.plans(self.round)
            self.started_at = now
            self.failed = False
            self.failed_at = None

    def fail(self, now: float) -> None:
        self.failed = True
        if self.failed_at is None:
            self.failed_at = now


class SimDriver:
    """Driver and JobDriver of one simulated agent."""

    def __init__(self, agent: SimAgent) -> None:
        self.agent = agent
        self.job = agent.channel
        self.round = 0
        self.running = False
        self.stopped_at_end = True

    # -- Driver ------------------------------------------------------------------------------

    def rendezvous(self) -> None:
        a, sim = self.agent, self.agent.sim
        restart = self.round > 0
        a.poll_rendezvous(restart)
        sim.rdzv.join(a.index, sim.sched.now)
        joined_at = sim.sched.now
        target = sim.rdzv.round + (0 if a.index not in sim.rdzv.joined else 1)
        while sim.rdzv.round < target or a.index in sim.rdzv.joined:
            if sim.sched.now - joined_at >= JOIN_TIMEOUT:
                sim.rdzv.joined.discard(a.index)
                raise TimeoutError("rendezvous join timeout")
            sim.sched.block(a, sim.sched.now + POLL,
                            ready=lambda: a.index not in sim.rdzv.joined)
            if a.index in sim.rdzv.joined:
                try:
                    a.poll_rendezvous(restart)
                except BaseException:
                    sim.rdzv.joined.discard(a.index)
                    raise
        self.round = sim.rdzv.round

    def start_workers(self) -> None:
        self.running = True
        self.started_round = self.round

    def stop_workers(self) -> None:
        self.running = False

    def monitor(self) -> Any:
        sim, now = self.agent.sim, self.agent.sim.sched.now
        rdzv = sim.rdzv
        if self.round != rdzv.round or not self.running:
            return make_result("HEALTHY")  # an old round's workers: they wait for a restart
        plan = rdzv.plan
        at = plan.fail_at.get(self.agent.index)
        if at is not None and now >= rdzv.started_at + at:
            rdzv.fail(now)
            return make_result("FAILED")
        if rdzv.failed_at is not None and now >= rdzv.failed_at + COLLECTIVE_TIMEOUT:
            return make_result("FAILED")
        if plan.succeed_at is not None and not plan.fail_at and now >= rdzv.started_at + \
                plan.succeed_at and not rdzv.failed:
            return make_result("SUCCEEDED")
        return make_result("HEALTHY")

    def num_nodes_waiting(self) -> int:
        rdzv = self.agent.sim.rdzv
        return len(rdzv.joined) if self.round == rdzv.round else 0

    def exit_barrier(self, timeout: float) -> None:
        a, sim = self.agent, self.agent.sim
        if a.lifecycle is not None and a.lifecycle.state_name == "SUCCEEDED":
            a.guard(self.job.mark_finishing)
        arrived = sim.rdzv.arrived.setdefault(self.round, set())
        arrived.add(a.index)
        members = set(sim.rdzv.members) if self.round == sim.rdzv.round else set()
        start = sim.sched.now
        while not members <= arrived:
            if a.job_outcome() is not None:
                return
            if sim.sched.now - start >= timeout:
                raise TimeoutError("exit barrier")
            sim.sched.block(a, sim.sched.now + POLL,
                            ready=lambda: members <= arrived)

    def put_metric(self, name: str, value: int) -> None:
        pass

    # -- JobDriver ---------------------------------------------------------------------------

    def job_restart_count(self, window: float, budget: str = "") -> int:
        return self.agent.guard(lambda: self.job.restart_count(window, budget=budget)) or 0

    def job_restarts_left(self, max_restarts: int, window: float, budget: str = "") -> int:
        return self.job.restarts_left(str(self.round), max_restarts, window, budget=budget)

    def add_job_restart(self, max_restarts: int, window: float, budget: str = "") -> int:
        return self.job.claim_restart(str(self.round), max_restarts, window, budget=budget)

    def announce_failure(self, exit_code: int, reason: str) -> None:
        self.agent.announce(exit_code, reason)


class SimAgent:
    def __init__(self, sim: SimJob, index: int) -> None:
        self.sim = sim
        self.index = index
        self.channel = JobChannel(sim.store, "sim", f"node{index}", poll_interval=POLL,
                                  clock=lambda: sim.sched.now, wall=lambda: sim.sched.now)
        self.driver = SimDriver(self)
        self.lifecycle: Lifecycle | None = None
        self.lost: JobOutcome | None = None
        self.announced_here = False
        self.until: float | None = None
        self.ready: Callable[[], bool] | None = None
        self.resume = threading.Semaphore(0)
        self.killed = False
        self.ended = False
        self.crashed = False
        self.exit_code: int | None = None
        self.ended_at: float | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True, name=f"sim-{index}")

    def kill(self) -> None:
        self.killed = True
        rdzv = self.sim.rdzv
        rdzv.joined.discard(self.index)
        if self.driver.running and self.driver.round == rdzv.round:
            rdzv.fail(self.sim.sched.now)  # its workers die with it
        self.driver.running = False

    # -- the torch agent's glue, simulated ---------------------------------------------------

    def guard(self, fn: Callable[[], Any]) -> Any:
        """A store call; a store error is the store lost (as AgentJob.check)."""
        try:
            return fn()
        except ConnectionError as e:
            if self.lost is None:
                self.lost = JobOutcome(1, f"node{self.index}", f"store unreachable: {e}")
            return None

    def job_outcome(self) -> JobOutcome | None:
        if self.lost is not None:
            return self.lost
        self.guard(self.channel.poll)
        return self.channel.outcome or self.lost

    def announce(self, code: int, reason: str) -> None:
        won = self.guard(lambda: self.channel.announce(code, reason))
        if won is not None and won.node == self.channel.node:
            self.announced_here = True

    def poll_rendezvous(self, restart: bool) -> None:
        outcome = self.job_outcome()
        if outcome is None and restart and self.guard(self.channel.finishing):
            self.announce(1, "a node already finished")
            outcome = self.channel.outcome
        if outcome is not None:
            raise JobOver(outcome)

    def wait(self, seconds: float) -> str | None:
        end = self.sim.sched.now + seconds
        while True:
            if self.job_outcome() is not None:
                return JOB_FAILED
            left = end - self.sim.sched.now
            if left <= 0:
                return None
            self.sim.sched.sleep(self, min(left, POLL))

    def _main(self) -> None:
        sched = self.sim.sched
        try:
            sched.block(self, None, ready=lambda: True)
            self.lifecycle = Lifecycle(
                self.sim.spec, self.driver, max_restarts=self.sim.max_restarts,
                exit_barrier_timeout=BARRIER_TIMEOUT, fatal_exceptions=(Crashed,),
                clock=_Clock(self), rng=self.sim.rng)
            code = 0
            try:
                self.lifecycle.run(MONITOR_INTERVAL, sleep=self.wait)
                code = 0 if self.lifecycle.state_name == "SUCCEEDED" else \
                    (self.lifecycle.exit_code or 1)
            except WorkerGroupFailureException:
                code = self.lifecycle.exit_code or 1
            except (ActionError, LifecycleError, TimeoutError) as e:
                self.error = e
                self.announce(1, f"{type(e).__name__}: {e}")
                code = 1
            self.driver.running = False
            outcome = self.job_outcome()
            if outcome is not None and self.lost is None:
                # linger: until every member acknowledged, at most LINGER_TIMEOUT
                n = max(1, len(self.sim.rdzv.members))
                end = sched.now + LINGER_TIMEOUT
                while (self.guard(self.channel.acks) or 0) < n and sched.now < end:
                    sched.sleep(self, POLL)
            if outcome is not None and not self.announced_here:
                code = outcome.exit_code
            self.exit_code = code
        except Crashed:
            self.crashed = True
        except BaseException as e:  # a bug in the simulation or the engine: report it
            self.error = e
            self.exit_code = -1
        finally:
            self.ended = True
            self.ended_at = sched.now
            with contextlib.suppress(ValueError):
                sched._back.release()


class _Clock:
    """The lifecycle's clock: the scheduler's virtual time; sleeping yields to the others."""

    def __init__(self, agent: SimAgent) -> None:
        self.agent = agent

    def now(self) -> float:
        return self.agent.sim.sched.now

    def sleep(self, seconds: float) -> None:
        self.agent.sim.sched.sleep(self.agent, seconds)


class SimJob:
    """One job: N agents of ``spec``, a store, a rendezvous, scripted workers and faults."""

    def __init__(self, spec: str, n: int, max_restarts: int, plans: Callable[[int], RoundPlan],
                 faults: Faults, choose: Callable[[int], int]) -> None:
        import random

        self.spec = spec
        self.max_restarts = max_restarts
        self.store = MemoryStore(timeout=0.0)
        self.sched = Scheduler(choose)
        self.rdzv = SimRendezvous(n, plans)
        self.faults = faults
        self.rng = random.Random(0)
        self.agents = [SimAgent(self, i) for i in range(n)]
        self.announced_at: float | None = None

    def _on_time(self) -> None:
        if self.announced_at is None and not self.store.closed \
                and self.store.check([self.agents[0].channel.outcome_key]):
            self.announced_at = self.sched.now
        dies = self.faults.store_dies_at
        if dies is not None and self.sched.now >= dies and not self.store.closed:
            self.store.close()

    def run(self) -> bool:
        return self.sched.run(self.agents, self.faults, self._on_time)

    def __repr__(self) -> str:
        plans = [self.rdzv.plans(r) for r in range(1, 7)]
        return (f"SimJob({self.spec!r}, n={len(self.agents)}, max_restarts={self.max_restarts}, "
                f"plans={plans}, faults={self.faults})")
