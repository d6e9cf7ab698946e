"""A one-machine Slurm cluster for the tests in this directory (Debian's ``slurm-wlm``); the
fixtures are in conftest.py (a unique module name: several test directories have a ``conftest``).

The cluster behind the ``slurm`` fixture (one per pytest process) starts munged with a key and a
socket of its own, slurmctld and slurmd in the foreground (``-D``), all as root on this host,
configured by a slurm.conf generated into a temporary directory (``SLURM_CONF`` in the environment
of every Slurm command the helpers run). It skips, with the reason, when the binaries are missing,
when the tests do not run as root, or when a daemon does not come up (the reason then ends with the
daemon's last log lines), or fails instead where ``FSM_AGENT_REQUIRE_SLURM=1`` (CI). After each
test, :meth:`SlurmCluster.end_test` cancels every job and checks that nothing carrying the test's
directory in its environment is left; teardown stops the daemons and munged and checks the same of
the cluster's directory (slurmstepd, the jobs' processes): what is left is killed, and named in a
failure.

``ProctrackType`` matters for the drain tests: ``proctrack/linuxproc`` (the ``slurm`` fixture)
tracks and signals every descendant of the step, as ``proctrack/cgroup`` on a real cluster does;
``proctrack/pgid`` (the ``slurm_pgid`` fixture) signals only the task's process group, which
fsm-agent's workers (a session of their own) are not in.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "slurmstepd", "sbatch", "srun",
            "scontrol", "squeue", "sinfo", "scancel")
INSTALL = "DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge"
#: set (to 1) where the tests must run: a missing Slurm, or one that does not start, fails them
REQUIRE = "FSM_AGENT_REQUIRE_SLURM"

#: how long a requeued batch job waits before it may start again (AuthInfo cred_expire: Slurm's
#: default is 120 s, which would make a requeue test wait two minutes)
CRED_EXPIRE = 5
#: SIGTERM to SIGKILL when Slurm stops a job (Slurm's default: 30 s)
KILL_WAIT = 5
#: fsm-agent's no_requeue_exit_code (the resilient preset's default): Slurm holds a job that exits
#: with it (RequeueExitHold) instead of ending it
REQUEUE_EXIT_HOLD = 93

#: the fsm-agent of the Python running the tests (not the one on PATH, whatever the cwd)
FSM_AGENT = str(Path(sys.executable).parent / "fsm-agent")


def unavailable(reason: str) -> None:
    """Skip with the reason; fail with it where :data:`REQUIRE` is set (raises either way)."""
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{REQUIRE}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"({path}: {e.strerror})"
    return "\n".join(text[-lines:]) or f"({path} is empty)"


def parse_scontrol(line: str) -> dict[str, str]:
    """``scontrol show -o`` output (``Key=Value`` separated by spaces) as a dict."""
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9_:/]*", key):
            fields[key] = value
        elif fields:  # a value with a space in it (Command=, Comment=, Reason=...)
            last = next(reversed(fields))
            fields[last] += " " + token
    return fields


class SlurmCluster:
    """munged, slurmctld and slurmd on localhost, configured under ``root``."""

    def __init__(self, root: Path, proctrack: str = "proctrack/linuxproc") -> None:
        self.root = root
        self.proctrack = proctrack
        self.host = socket.gethostname()
        self.conf = root / "slurm.conf"
        self.logs = root / "log"
        self.jobs_dir = root / "jobs"
        self.munge_socket = root / "munge" / "munge.socket"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        # srun/sbatch options that a test's environment could set would change the jobs
        for name in list(self.env):
            if name.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and name != "SLURM_CONF":
                del self.env[name]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._scripts = 0

    # -- the daemons -----------------------------------------------------------------------------

    def _write_config(self) -> None:
        for sub in ("munge", "state", "spool", "log", "jobs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        ctld_port, slurmd_port = _free_port(), _free_port()
        r = self.root
        self.conf.write_text(f"""\
ClusterName=fsmtest
SlurmctldHost={self.host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={self.logs}/slurmctld.log
SlurmdLogFile={self.logs}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType={self.proctrack}
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
JobRequeue=1
KillWait={KILL_WAIT}
RequeueExitHold={REQUEUE_EXIT_HOLD}
ReturnToService=2
MinJobAge=600
NodeName={self.host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.logs / f"{name}.out", "wb")  # noqa: SIM115 (kept open while it runs)
        try:
            self.procs[name] = subprocess.Popen(argv, env=self.env, stdout=out,
                                                stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, cwd=self.root)
        finally:
            out.close()

    def _fail(self, name: str, what: str) -> None:
        """Skip (raises) with what went wrong and the daemon's last lines."""
        logs = [self.logs / f"{name}.out"]
        if name in ("slurmctld", "slurmd"):
            logs.append(self.logs / f"{name}.log")
        tails = "\n".join(f"--- {p.name}:\n{_tail(p)}" for p in logs)
        self.stop()
        unavailable(f"{name} {what}\n{tails}")

    def _wait(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            proc = self.procs[name]
            if proc.poll() is not None:
                self._fail(name, f"exited with {proc.returncode} at start")
            if time.monotonic() > deadline:
                self._fail(name, f"not ready within {timeout:g} s")
            time.sleep(0.2)

    def start(self) -> None:
        self._write_config()
        key = self.root / "munge" / "munge.key"
        made = subprocess.run(["mungekey", "--create", f"--keyfile={key}", "--force"],
                              capture_output=True, text=True)
        if made.returncode:
            unavailable(f"mungekey --create failed ({made.returncode}): {made.stderr.strip()}")
        m = self.root / "munge"
        self._spawn("munged", ["munged", "--foreground", "--force",
                               f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={m}/munged.pid", f"--seed-file={m}/munged.seed",
                               f"--log-file={self.logs}/munged.log"])
        self._wait("munged", self._munge_works, 15)
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self._wait("slurmctld", self._controller_up, 30)
        self._spawn("slurmd", ["slurmd", "-D", "-N", self.host])
        self._wait("slurmd", self._node_idle, 30)

    def _munge_works(self) -> bool:
        if not self.munge_socket.exists():
            return False
        cred = subprocess.run(["munge", "-n", "-S", str(self.munge_socket)], capture_output=True)
        return cred.returncode == 0 and subprocess.run(
            ["unmunge", "-S", str(self.munge_socket)], input=cred.stdout,
            capture_output=True).returncode == 0

    def _controller_up(self) -> bool:
        return "is UP" in self.run("scontrol", "ping", check=False).stdout

    def _node_idle(self) -> bool:
        return self.run("sinfo", "-h", "-n", self.host, "-o", "%T",
                        check=False).stdout.strip() == "idle"

    def cancel_all(self) -> None:
        """Cancel every job and wait (up to KillWait and a margin) until none is left."""
        if "slurmctld" not in self.procs or self.procs["slurmctld"].poll() is not None:
            return
        self.run("scancel", "--user", "root", check=False)
        deadline = time.monotonic() + KILL_WAIT + 10
        while time.monotonic() < deadline and self.run(
                "squeue", "-h", "-o", "%i", check=False).stdout.strip():
            time.sleep(0.2)

    def end_test(self, out_dir: Path) -> list[str]:
        """After a test: cancel every job, then wait for every process that carries ``out_dir``
        in its environment (the jobs' OUT_DIR) to end; kill and return those that do not."""
        self.cancel_all()
        return _leftovers(str(out_dir).encode(), wait=KILL_WAIT + 5)

    def stop(self) -> list[str]:
        """Cancel every job, stop the daemons and munged; kill and return (``pid cmdline``)
        whatever carrying the cluster's directory is still running a few seconds later."""
        self.cancel_all()
        left = []
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                left.append(f"{proc.pid} {name} (did not stop on SIGTERM within 10 s)")
                proc.kill()
                proc.wait()
        # slurmstepd daemonizes, away from slurmd: it and the jobs' processes carry the
        # cluster's directory in their environment (SLURM_CONF)
        return left + _leftovers(str(self.root).encode(), wait=5)

    # -- the helpers -----------------------------------------------------------------------------

    def run(self, *argv: str, check: bool = True,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: "
                                 f"{done.stderr.strip() or done.stdout.strip()}")
        return done

    def sbatch(self, script_text: str, *args: str) -> str:
        """Submit the batch script; its output goes (appended, across requeues) to
        ``output(job_id)``. Returns the job id."""
        self._scripts += 1
        script = self.jobs_dir / f"job{self._scripts}.sh"
        script.write_text(script_text)
        done = self.run("sbatch", "--parsable", "--open-mode=append",
                        f"--output={self.jobs_dir}/slurm-%j.out", *args, str(script))
        return done.stdout.strip().split(";")[0]

    def output(self, job_id: str) -> str:
        path = self.jobs_dir / f"slurm-{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def job_state(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o``: JobState, Restarts, ExitCode, Reason... (empty once gone)."""
        done = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        return parse_scontrol(done.stdout) if done.returncode == 0 else {}

    def wait_state(self, job_id: str, states: str | Iterable[str], timeout: float,
                   where: Callable[[dict[str, str]], bool] | None = None) -> dict[str, str]:
        """Wait until the job's JobState is one of ``states`` (and ``where`` holds)."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        while True:
            state = self.job_state(job_id)
            summary = describe(state)
            if not seen or seen[-1] != summary:
                seen.append(summary)
            if state.get("JobState") in wanted and (where is None or where(state)):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"job {job_id} not {'/'.join(sorted(wanted))} within {timeout:g} s; "
                    f"states seen: {seen}\n--- output:\n{self.output(job_id)}")
            time.sleep(0.25)


def describe(state: dict[str, str]) -> str:
    return " ".join(f"{k}={state.get(k)}" for k in ("JobState", "Reason", "ExitCode", "Restarts",
                                                   "SubmitTime", "EligibleTime"))


def _leftovers(mark: bytes, wait: float) -> list[str]:
    """Wait up to ``wait`` seconds for every process whose environment contains ``mark`` to
    end; SIGKILL those still running then, and return them (``pid cmdline``)."""
    deadline = time.monotonic() + wait
    while True:
        left = running(mark)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [f"{pid} {cmd}" for pid, cmd in sorted(left.items())]


def running(mark: bytes) -> dict[int, str]:
    """The processes (but this one) whose environment contains ``mark``: pid -> command line."""
    return {pid: _cmdline(pid) for pid in _pids() if pid != os.getpid() and mark in _environ(pid)}


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


