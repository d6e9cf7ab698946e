"""Fixtures for the torch-derived agent tests: in-process agents on real worker processes, agent
processes for multi-agent jobs, and the guarantee that no process outlives a test."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import queue
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import upstream_workers as workers
from fsm_test_procs import TOKEN_VAR, free_port, kill_leftovers

__all__ = ["Procs", "endpoint", "free_port", "listening_ports", "procs", "run_scenarios"]

_PRELOAD = workers.PRELOAD


def endpoint() -> str:
    """A c10d/static endpoint on loopback, as torch's test picks one (a port free right now)."""
    return f"localhost:{free_port()}"


def listening_ports() -> set[int]:
    """TCP ports this process listens on (its TCPStore servers, say)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


class Procs:
    """Runs agents for one test: in this process or one process each (torch's ``run_job``)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.token = uuid.uuid4().hex
        self.children: list[Any] = []
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(_PRELOAD)

    def conf(self, entrypoint: Any, local_world_size: int, **kw: Any) -> workers.AgentConf:
        kw.setdefault("log_dir", str(self.tmp_path / f"logs{uuid.uuid4().hex[:6]}"))
        return workers.AgentConf(entrypoint=entrypoint, local_world_size=local_world_size, **kw)

    def run_agent(self, conf: workers.AgentConf, **agent_kwargs: Any) -> tuple[Any, Any]:
        """torch's ``run_agent`` in this process: ``(RunResult, agent)``; the handler is shut."""
        spec = workers.worker_spec(conf)
        agent = workers.make_agent(conf, spec, **agent_kwargs)
        try:
            return agent.run(), agent
        finally:
            spec.rdzv_handler.shutdown()

    def start_agents(self, confs: Sequence[workers.AgentConf], results: Any = None,
                     first_index: int = 0) -> tuple[list[Any], Any]:
        """One agent process per conf (forked from the preloaded forkserver), reporting on
        ``results`` (a new queue unless given) as ``first_index``, ``first_index + 1``, ...;
        ``(processes, queue)``."""
        if results is None:
            results = self.ctx.Queue()
        started = []
        for i, conf in enumerate(confs, start=first_index):
            p = self.ctx.Process(target=_agent_entry, args=(conf, results, i, self.token))
            p.start()
            self.children.append(p)
            started.append(p)
        return started, results

    def run_job(self, confs: Sequence[workers.AgentConf], timeout: float = 60
                ) -> dict[str, list[Any]]:
        """torch's ``run_job``: every agent in its own process; outcomes by role, in conf order."""
        started, results = self.start_agents(confs)
        return self.collect(started, results, timeout)

    def collect(self, started: Sequence[Any], results: Any, timeout: float
                ) -> dict[str, list[Any]]:
        deadline = time.monotonic() + timeout
        got: list[tuple[int, str, Any]] = []
        while len(got) < len(started):
            try:
                got.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline or not any(p.is_alive() for p in started):
                    break
        for p in started:
            p.join(max(0.1, deadline - time.monotonic()))
        if len(got) < len(started):
            pytest.fail(f"{len(started) - len(got)} of {len(started)} agents gave no result "
                        f"within {timeout} s (exit codes {[p.exitcode for p in started]})")
        by_role: dict[str, list[Any]] = {}
        for _, role, result in sorted(got, key=lambda g: g[0]):
            by_role.setdefault(role, []).append(result)
        return by_role

    def cleanup(self) -> set[int]:
        for p in self.children:
            if p.is_alive():
                p.kill()
            p.join(5)
        return kill_leftovers(self.token)


def _agent_entry(conf: workers.AgentConf, results: Any, index: int, token: str) -> None:
    # the token reaches this agent's workers: found again even if the agent is SIGKILLed
    os.environ[TOKEN_VAR] = token
    workers.agent_main(conf, results, index)


@pytest.fixture
def procs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Procs]:
    """Agents on real processes; fails the test if any process of theirs is left behind."""
    for var in ("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_ENABLE_FILE_TIMER",
                "TORCHELASTIC_TIMER_FILE", "TORCHELASTIC_HEALTH_CHECK_PORT"):
        monkeypatch.delenv(var, raising=False)
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        leaked = p.cleanup()
    if leaked:
        pytest.fail(f"processes left behind by the test: {sorted(leaked)}")


def run_scenarios(group: str, workdir: Path, timeout: float = 150) -> dict[str, dict[str, Any]]:
    """Run ``launcher_scenarios.py GROUP`` in a fresh interpreter, as upstream's class runs in
    one: what each scenario observed, by the upstream test's name. Fails if the interpreter
    fails or hangs, or leaves a process behind."""
    here = Path(__file__).parent
    token = uuid.uuid4().hex
    env = {**os.environ, TOKEN_VAR: token, "PYTHONPATH": os.pathsep.join(
        [str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])}
    for var in ("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_HEALTH_CHECK_PORT", "LOGLEVEL"):
        env.pop(var, None)
    proc = subprocess.Popen([sys.executable, str(here / "launcher_scenarios.py"), group,
                             str(workdir)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"scenarios {group} hung: {out[-3000:]}")
    finally:
        leaked = kill_leftovers(token)
    assert proc.returncode == 0, out[-3000:]
    assert not leaked, f"processes left behind: {sorted(leaked)}"
    results = workdir / "results.jsonl"
    lines = results.read_text().splitlines() if results.exists() else []
    return {r["test"]: r for r in map(json.loads, lines)}
