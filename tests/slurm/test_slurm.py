"""``sbatch --requeue`` jobs whose step is ``srun fsm-agent run --spec resilient`` on a real
(one-machine) Slurm, with the batch script of docs/multinode.md ("Under Slurm"): a preemption by
``scontrol requeue`` and by a time limit's ``--signal``, a no-retry failure (93) and a failed node
health check (75), and what Slurm then does to the job (JobState, ExitCode, Restarts, Reason).

Each test's worker and agent write into the test's ``tmp_path`` (OUT_DIR); the fixture fails a
test that leaves any of their processes running.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import FSM_AGENT, REQUEUE_EXIT_HOLD, SlurmCluster, describe, running

DRAIN_WORKER = Path(__file__).parents[1] / "reliability" / "scripts" / "drain_worker.py"
EXIT3_WORKER = Path(__file__).parent / "scripts" / "exit3_worker.py"

#: fsm-agent's exit code after a drain on SIGUSR1 / SIGTERM (the resilient preset's
#: preempted_exit_code 0: 128 + the signal, as a shell reports it)
PREEMPTED_USR1, PREEMPTED_TERM = 128 + signal.SIGUSR1, 128 + signal.SIGTERM
UNHEALTHY = 75  # the resilient preset's unhealthy_exit_code
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


GUIDE = Path(__file__).parents[2] / "docs" / "multinode.md"


def _guide_script() -> str:
    m = re.search(r"<!-- test: slurm-job -->\n```bash\n(.*?)```", GUIDE.read_text(), re.S)
    assert m, f"{GUIDE}: no block marked test: slurm-job"
    return m.group(1)


def _replace(script: str, old: str, new: str) -> str:
    assert script.count(old) == 1, f"{GUIDE}'s slurm-job script has no single {old!r}"
    return script.replace(old, new)


def batch_script(out: Path, *params: str, worker: Path = DRAIN_WORKER, agent_args: str = "",
                 env: str = "") -> str:
    """docs/multinode.md's job script ("Under Slurm"), with this test's worker, parameters and
    OUT_DIR, and lines that log where the script is (``batch.log``); its ``#SBATCH`` options
    are the test's to give."""
    spec_params = " ".join(f"--spec-param {shlex.quote(p)}" for p in ("drain_timeout=3s", *params))
    script = _guide_script()
    script = re.sub(r"^#SBATCH .*\n", "", script, flags=re.M)
    script = _replace(script, "#!/bin/bash\n", f"""#!/bin/bash
export OUT_DIR={shlex.quote(str(out))}
{env}
echo "batch: start restart=${{SLURM_RESTART_COUNT:-0}} job=$SLURM_JOB_ID" >> "$OUT_DIR/batch.log"
""")
    script = _replace(script, '"agent-$SLURM_JOB_ID-$(hostname).log"', '"$OUT_DIR/agent.log"')
    script = _replace(script, "fsm-agent run ... ", f"{FSM_AGENT} run --standalone "
                      "--nproc-per-node 1 --monitor-interval 0.05 ")
    script = _replace(script, " train.py\n", f" {spec_params} {agent_args} {worker}\n")
    return _replace(script, "rc=$?\n",
                    'rc=$?\necho "batch: srun exited $rc" >> "$OUT_DIR/batch.log"\n')


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def wait_file(path: Path, timeout: float, slurm: SlurmCluster, job: str) -> Path:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {path.name} within {timeout:g} s; job: "
                                 f"{describe(slurm.job_state(job))}\n{slurm.output(job)}")
        time.sleep(0.1)
    return path


def wait_text(path: Path, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while needle not in text(path):
        if time.monotonic() > deadline:
            raise AssertionError(f"{needle!r} not in {path.name} within {timeout:g} s:\n"
                                 f"{text(path)}")
        time.sleep(0.1)
    return text(path)


def text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def show(name: str, state: dict[str, str], slurm: SlurmCluster, job: str, out: Path) -> str:
    """What a failed assertion prints: the job's state, the batch log, the outputs."""
    return (f"[{name}] {describe(state)}\n{text(out / 'batch.log')}--- job output:\n"
            f"{slurm.output(job)}--- agent.log:\n{text(out / 'agent.log')}")


def requeue_a_running_job(slurm: SlurmCluster, out: Path, *params: str,
                          env: str = "") -> tuple[str, dict[str, str], dict[str, Any]]:
    """Submit, wait for the worker, ``scontrol requeue``; returns the job, its state once
    pending again, and the first worker's start record."""
    job = slurm.sbatch(batch_script(out, *params, env=env), "--requeue")
    first = read_json(wait_file(out / "start_r0.json", 30, slurm, job))
    # what the fixture's check for leftovers looks for (OUT_DIR in the environment): the
    # batch script, srun, the agent and its worker
    mine = " ".join(running(str(out).encode()).values())
    assert "fsm-agent run" in mine and DRAIN_WORKER.name in mine, mine
    slurm.run("scontrol", "requeue", job)
    requeued = slurm.wait_state(job, "PENDING", 30, where=lambda s: s["Restarts"] == "1")
    return job, requeued, first


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_requeue_drains_the_workers_and_the_job_runs_again(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """The recommended set-up: the workers handle SIGTERM, the signal Slurm sends every process
    of the step on a requeue (proctrack/cgroup or linuxproc), and the agent drains with it too
    (drain_signal=SIGTERM, the default). The worker checkpoints, the agent exits 143, Slurm
    requeues the job and starts it again (after cred_expire), restart count 1."""
    job, requeued, first = requeue_a_running_job(slurm, tmp_path, env="export DRAIN_SIGNAL=SIGTERM")
    agent = wait_text(tmp_path / "agent.log", "fsm-agent run: ", 15)
    why = show("requeue", requeued, slurm, job, tmp_path)
    assert read_json(tmp_path / "drained_r0.json")["signal"] == signal.SIGTERM, why
    assert read_json(tmp_path / "checkpointed_r0.json")["pid"] == first["pid"], why
    assert ("fsm-agent run: preempted (received SIGTERM); workers drained "
            f"(exit {PREEMPTED_TERM})") in agent, why
    assert requeued["Reason"] == "BeginTime", why  # held back for cred_expire after a requeue
    # the batch script dies of the requeue's SIGTERM too: its own requeue (on 143) is not needed
    assert "srun exited" not in text(tmp_path / "batch.log"), why
    # started again: a new batch script (SLURM_RESTART_COUNT=1), a new worker
    wait_text(tmp_path / "batch.log", "batch: start restart=1", 30)
    deadline = time.monotonic() + 30
    while read_json(tmp_path / "start_r0.json")["pid"] == first["pid"]:
        assert time.monotonic() < deadline, f"no new worker: {describe(slurm.job_state(job))}"
        time.sleep(0.1)
    again = slurm.job_state(job)
    assert again["JobState"] == "RUNNING" and again["Restarts"] == "1", describe(again)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_requeue_with_a_drain_signal_slurm_does_not_send_says_the_worker_was_killed(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """drain_signal=SIGUSR1 with workers that handle only SIGUSR1: Slurm's own SIGTERM reaches
    the worker as it reaches the agent and kills it before the drain's SIGUSR1 can run its
    checkpoint. The drain ends (the job is requeued, exit 143), and the agent says what happened
    instead of "workers drained"."""
    job, requeued, _ = requeue_a_running_job(slurm, tmp_path, "drain_signal=SIGUSR1")
    agent = wait_text(tmp_path / "agent.log", "fsm-agent run: ", 15)
    why = show("requeue-usr1", requeued, slurm, job, tmp_path)
    assert not (tmp_path / "checkpointed_r0.json").exists(), why
    assert ("fsm-agent run: preempted (received SIGTERM); not every worker drained: local "
            f"rank 0 killed by SIGTERM (exit {PREEMPTED_TERM})") in agent, why
    assert "SIGTERM is not the drain signal (SIGUSR1)" in agent, why
    assert "workers drained" not in agent, why


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_requeue_under_proctrack_pgid_signals_the_agent_alone(
        slurm_pgid: SlurmCluster, tmp_path: Path) -> None:
    """proctrack/pgid: Slurm's SIGTERM reaches the task's process group, the agent only (its
    workers are in sessions of their own); the agent drains them with SIGUSR1, they checkpoint.
    The agent's lines after the requeue reach only the file it writes from inside the step."""
    job, requeued, first = requeue_a_running_job(slurm_pgid, tmp_path, "drain_signal=SIGUSR1")
    agent = wait_text(tmp_path / "agent.log", "fsm-agent run: ", 15)
    why = show("requeue-pgid", requeued, slurm_pgid, job, tmp_path)
    assert read_json(tmp_path / "drained_r0.json")["signal"] == signal.SIGUSR1, why
    assert read_json(tmp_path / "checkpointed_r0.json")["pid"] == first["pid"], why
    assert ("fsm-agent run: preempted (received SIGTERM); workers drained "
            f"(exit {PREEMPTED_TERM})") in agent, why
    # none of it in the step's output, which slurmstepd stops forwarding at the requeue
    assert "fsm-agent run: " not in slurm_pgid.output(job), why


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_time_limit_warning_drains_and_the_script_requeues_the_job(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """``--time=2 --signal=USR1@118``: Slurm sends SIGUSR1 to every process of the step 118 s
    before the limit, at its next look at time limits (slurmctld looks every 30 s, so 2 to
    ~32 s after the start: the warning may come up to that much earlier than asked). A limit of
    two minutes leaves it three looks before the job is cancelled, not one or two: on a loaded
    machine one minute ran out before the drain was written. The agent
    (drain_on=SIGUSR1,SIGTERM, as in the guide's script) drains with it and exits 138, which
    Slurm alone would record as FAILED (ExitCode 138:0): the batch script requeues the job."""
    job = slurm.sbatch(batch_script(tmp_path, "drain_signal=SIGUSR1"),
                       "--requeue", "--time=2", "--signal=USR1@118")
    started = read_json(wait_file(tmp_path / "start_r0.json", 30, slurm, job))
    drained = read_json(wait_file(tmp_path / "drained_r0.json", 80, slurm, job))
    state = slurm.wait_state(job, TERMINAL | {"PENDING"}, 30)
    why = show("time-limit", state, slurm, job, tmp_path)
    assert drained["time"] < started["time"] + 120 - 5, "the drain must come before the limit"
    assert drained["signal"] == signal.SIGUSR1, why
    assert (tmp_path / "checkpointed_r0.json").exists(), why
    assert f"srun exited {PREEMPTED_USR1}" in text(tmp_path / "batch.log"), why
    assert (f"fsm-agent run: preempted (received SIGUSR1); workers drained "
            f"(exit {PREEMPTED_USR1})") in text(tmp_path / "agent.log"), why
    # Each run of the requeued job gets its own warning soon after it starts (the limit is
    # still 2 min), so on a loaded machine the job may have gone round more than once by the
    # time we look: requeued at least once is the script's doing.
    assert state["JobState"] == "PENDING" and int(state["Restarts"]) >= 1, why


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_no_retry_failure_exits_93_and_slurm_holds_the_job(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """no_retry_exit_codes=[3]: the worker's exit 3 gives up at once (no restart) with 93, and
    RequeueExitHold=93 in slurm.conf makes Slurm requeue the job held (SPECIAL_EXIT, priority
    0): it stays pending until someone looks (scontrol release)."""
    job = slurm.sbatch(batch_script(tmp_path, "no_retry_exit_codes=[3]", worker=EXIT3_WORKER,
                                    agent_args="--max-restarts 2"), "--requeue")
    state = slurm.wait_state(job, {"SPECIAL_EXIT", "REQUEUE_HOLD", *TERMINAL}, 40,
                             where=lambda s: s["JobState"] in TERMINAL or s["Restarts"] == "1")
    why = show("no-retry", state, slurm, job, tmp_path)
    assert f"srun exited {REQUEUE_EXIT_HOLD}" in text(tmp_path / "batch.log"), why
    assert f"exit code {REQUEUE_EXIT_HOLD}, as spec 'resilient' asked on giving up" in \
        text(tmp_path / "agent.log"), why
    assert sorted(p.name for p in tmp_path.glob("start_r0_a*.json")) == ["start_r0_a0.json"], \
        "a no-retry exit code must not restart the worker"
    assert state["JobState"] == "SPECIAL_EXIT", why
    assert state["Reason"] == "JobHeldUser", why
    assert state["ExitCode"] == f"{REQUEUE_EXIT_HOLD}:0", why
    assert state["Restarts"] == "1", why
    assert state["Priority"] == "0", why
    time.sleep(2 * 2)  # two scheduler intervals (sched_interval=2): held, it does not start
    assert slurm.job_state(job)["JobState"] == "SPECIAL_EXIT"
    assert "batch: start restart=1" not in text(tmp_path / "batch.log")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_failed_health_check_exits_75_and_the_job_fails(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """health_command=false: the node fails its health check before the first rendezvous, the
    agent leaves with 75 and starts no worker; Slurm, without RequeueExit=75, ends the job
    FAILED with ExitCode 75:0, not requeued."""
    job = slurm.sbatch(batch_script(tmp_path, "health_command=false"), "--requeue")
    state = slurm.wait_state(job, TERMINAL | {"SPECIAL_EXIT", "REQUEUE_HOLD"}, 40)
    why = show("health", state, slurm, job, tmp_path)
    assert f"srun exited {UNHEALTHY}" in text(tmp_path / "batch.log"), why
    assert f"left the job: command_succeeds: command false exited 1 (exit {UNHEALTHY})" in \
        text(tmp_path / "agent.log"), why
    assert not (tmp_path / "start_r0.json").exists(), "an unhealthy node starts no worker"
    assert state["JobState"] == "FAILED", why
    assert state["ExitCode"] == f"{UNHEALTHY}:0", why
    assert state["Restarts"] == "0", why
