"""Real multi-agent jobs on loopback: two ``fsm-agent run`` agents as two nodes of one job (c10d
rendezvous on a loopback port, one worker each). Every agent ends with one outcome."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pickle
import re
import signal
import time
from pathlib import Path

import pytest
from job_helpers import Job, Jobs, nodes, port_of

PRESETS = ("torchelastic", "torchrun", "resilient")


def _spec_args(preset: str) -> list[str]:
    # (resilient's default backoff is 1 s, then 2 s: short enough here)
    return ["--spec", preset]


def _two(jobs: Jobs, args: list[str], env: dict[str, str]) -> tuple[Job, Job]:
    host = jobs.start(args, env=env, name="node_a")
    host.wait_listening(port_of(args), 60)  # the first agent hosts the rendezvous store
    return host, jobs.start(args, env=env, name="node_b")


def _starts(job: Job) -> list[dict[str, object]]:
    return job.records("start_*.json")


ROOT = Path(__file__).resolve().parents[2]
# A log line of the agent quoted in the docs: `W... fsm_agent/torch/_agent.py:...] MESSAGE`.
QUOTED_LOG = re.compile(r"^[DIWE]\.\.\. (fsm_agent/\S+\.py):(?:\d+|\.\.\.)\] (.*)$", re.M)


def quoted_log_lines(starting: str) -> list[tuple[str, str, str]]:
    """``(where, file, message)`` of every agent log line quoted in README.md and docs/ whose
    message starts with ``starting``."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for m in QUOTED_LOG.finditer(text):
            if m.group(2).startswith(starting):
                where = f"{doc.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
                found.append((where, m.group(1), m.group(2)))
    return found


def printed_as_quoted(message: str, file: str, output: str) -> bool:
    """Whether ``output`` has a line from ``file`` that says ``message``, whose numbers are
    the doc's example (a count, a restart budget) and may differ."""
    words = re.split(r"\d+", message)
    pattern = re.escape(f"{file}:") + r"\d+\] " + r"\d+".join(map(re.escape, words)) + "$"
    return re.search(pattern, output, re.M) is not None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("preset", PRESETS)
def test_a_give_up_ends_both_nodes_with_the_same_code(jobs: Jobs, preset: str) -> None:
    # The issue's job: node 1's worker always fails, one restart allowed. torch's agents took
    # 317 s (torchelastic: the give-up waited at the exit barrier for a peer waiting in the
    # next rendezvous) or a join timeout (torchrun).
    args = nodes(2, "--max-restarts", "1", *_spec_args(preset))
    a, b = _two(jobs, args, {"FAIL_GROUP_RANK": "1", "SLEEP": "120"})
    rc_a, rc_b = a.wait(60), b.wait(60)
    assert a.ended_at is not None and b.ended_at is not None
    apart = abs(a.ended_at - b.ended_at)
    out = a.output + b.output
    assert rc_a == rc_b == 1, out[-4000:]
    assert apart < 5, f"the agents ended {apart:.1f} s apart:\n{out[-4000:]}"
    # one of them gave up and said so; the other ended with its announcement
    gave_up = [j for j in (a, b) if "announced to every agent" in j.output]
    assert len(gave_up) == 1, out[-4000:]
    other = b if gave_up[0] is a else a
    assert other.final_message().startswith("fsm-agent run: the job failed:"), \
        other.output[-2000:]
    if preset == "torchelastic":
        # the restart line the docs quote is the one an agent prints
        quoted = quoted_log_lines("[default] worker group FAILED; restart")
        assert quoted
        for where, file, message in quoted:
            assert printed_as_quoted(message, file, out), (where, message, out[-4000:])


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("failing", ["0", "1", "-1"], ids=["node0", "node1", "both"])
def test_a_job_budget_of_two_allows_exactly_two_failure_restarts(jobs: Jobs,
                                                                  failing: str) -> None:
    args = nodes(2, "--max-restarts", "2", *_spec_args("resilient"))
    a, b = _two(jobs, args, {"FAIL_GROUP_RANK": failing, "SLEEP": "120"})
    rc_a, rc_b = a.wait(90), b.wait(90)
    out = a.output + b.output
    assert rc_a == rc_b == 1, out[-4000:]
    starts = _starts(a) + _starts(b)
    # TORCHELASTIC_RESTART_COUNT is the job's count on every node: rounds 0, 1 and 2 ran, on
    # both nodes (a node that did not fail restarts on the membership change), and no more.
    attempts = sorted({int(r["attempt"]) for r in starts})  # type: ignore[call-overload]
    assert attempts == [0, 1, 2], (attempts, out[-4000:])
    by_node = {(int(r["group_rank"]), int(r["attempt"])) for r in starts}  # type: ignore[call-overload]
    assert by_node == {(g, n) for g in (0, 1) for n in (0, 1, 2)}, by_node
    assert "restart budget is spent" in out or "gave up" in out, out[-4000:]
    if failing != "-1":
        # the node whose workers did not fail says whose did, not "nodes waiting to join"
        pattern = (r"\] (\S+)'s workers failed; restarting the worker group with it "
                   r"\(counted once for the job: (\d) of 2 used\)")
        said = {j: re.findall(pattern, j.output) for j in (a, b)}
        [survivor] = [j for j in (a, b) if said[j]]
        assert [n for _, n in said[survivor]] == ["1", "2"], survivor.output[-4000:]
        assert "membership change, not counted" not in survivor.output


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_fast_rejoin_cannot_bypass_max_restarts_0(jobs: Jobs) -> None:
    # pytorch/pytorch#147064: a node's agent stopped by a signal and started again at once
    # rejoined as a membership change, an uncounted restart, for ever. With a job budget the
    # departure counts; with none left the job is over, for the new agent too.
    # drain_on=[]: SIGTERM stops the agent, as torch (by default it would drain the whole job)
    args = nodes(2, "--max-restarts", "0", *_spec_args("resilient"), "--spec-param",
                 "drain_on=[]")
    # node a hosts the store and stays up a while after the job failed (its worker ignores
    # SIGTERM for the shutdown timeout), so that the new agent finds the store
    slow_stop = ["--shutdown-timeout", "15"]
    a = jobs.start([*args, *slow_stop], env={"SLEEP": "120", "TRAP_TERM": "ignore"},
                   name="node_a")
    a.wait_listening(port_of(args), 60)
    b = jobs.start(args, env={"SLEEP": "120"}, name="node_b")
    for job in (a, b):
        job.wait_for("start_*.json", 1, 60)
    os.killpg(b.pid, signal.SIGTERM)
    b.wait(30)
    again = jobs.start(args, env={"SLEEP": "120"}, name="node_b_again")
    rc_again, rc_a = again.wait(60), a.wait(60)
    out = a.output + b.output + again.output
    assert rc_a == rc_again == 1, out[-5000:]
    assert not _starts(again), "the new agent started workers in a job that was over"
    assert len(_starts(a)) == 1, "node a restarted its workers"
    last = again.final_message()
    assert last.startswith("fsm-agent run: the job failed: the job's restart budget is spent"), \
        again.output[-3000:]
    assert "the job failed" in a.output, a.output[-3000:]


@pytest.mark.timeout(150)
def test_the_store_host_dying_ends_every_agent_with_a_clear_message(jobs: Jobs) -> None:
    args = nodes(2, "--max-restarts", "3", *_spec_args("torchrun"))
    host, other = _two(jobs, args, {"SLEEP": "120"})
    for job in (host, other):
        job.wait_for("start_*.json", 1, 60)
    os.kill(host.pid, signal.SIGKILL)
    host.wait(10)
    killed = time.monotonic()
    # a SIGKILLed agent cannot stop its workers (docs/reliability.md): the test does
    for rec in _starts(host):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(rec["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    rc = other.wait(30)
    took = time.monotonic() - killed
    last = other.final_message()
    assert rc == 1, other.output[-3000:]
    assert took < 10, f"{took:.1f} s after the store's host died"
    assert last.startswith("fsm-agent run: the rendezvous store is unreachable"), last
    assert "workers stopped" in last, last


def _a_participant(store: object, run_id: str) -> str:
    """torch's name of a node of the rendezvous: any client of the store can read it (torch
    keeps its rendezvous state there, pickled)."""
    state = pickle.loads(base64.b64decode(store.get(f"torch.rendezvous.{run_id}")))  # type: ignore[attr-defined]
    return repr(sorted(state.participants)[0])


@pytest.mark.timeout(120)
def test_an_announcement_by_no_node_of_the_job_is_refused_with_one_warning(jobs: Jobs) -> None:
    # A foreign client of the store that writes the outcome key once ended every agent.
    from datetime import timedelta

    from torch.distributed import TCPStore

    args = nodes(2, "--max-restarts", "0", run_id="refused")
    a, b = _two(jobs, args, {"SLEEP": "120"})
    a.wait_for("start_*.json", 1, 60)
    (worker_b,) = b.wait_for("start_*.json", 1, 60)
    store = TCPStore("127.0.0.1", port_of(args), is_master=False,
                     timeout=timedelta(seconds=10))
    # the intruder speaks the protocol: it writes the outcome and wakes the watching agents
    from fsm_agent._core._job import JobChannel

    JobChannel(store, "refused", "intruder").announce(7, "forged")
    refused = "ignoring an outcome announced on the rendezvous store by intruder"
    for job in (a, b):
        job.wait_output(refused, 30)
    assert a.poll() is None and b.poll() is None, (a.output + b.output)[-4000:]
    # a real announcement still works: node b's worker dies, b gives up (no restarts left) and
    # its announcement replaces the forged one
    os.kill(int(worker_b["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    rcs = a.wait(60), b.wait(60)
    assert rcs == (1, 1), (a.output + b.output)[-4000:]
    for job in (a, b):
        assert job.output.count(refused) == 1, job.output[-4000:]
    assert "announced to every agent" in b.output and "announced to every agent" not in a.output
    last = a.final_message()  # a ended with b's announcement
    assert last.startswith("fsm-agent run: the job failed:"), last
    assert "forged" not in last and "intruder" not in last and "exit code 1" in last, last


@pytest.mark.timeout(120)
@pytest.mark.parametrize("code", [0, 256])
def test_an_announced_exit_code_that_is_no_failures_still_fails_every_agent(
        jobs: Jobs, code: int) -> None:
    # Anyone who reaches the store can write the outcome key: an announcement of 0 (or 256,
    # which a shell turns into 0) must not let a failed job pass for a success.
    from datetime import timedelta

    from torch.distributed import TCPStore

    args = nodes(2, run_id="forged")
    a, b = _two(jobs, args, {"SLEEP": "120"})
    a.wait_for("start_*.json", 1, 60)
    b.wait_for("start_*.json", 1, 60)
    store = TCPStore("127.0.0.1", port_of(args), is_master=False,
                     timeout=timedelta(seconds=10))
    # ... and its words reach every agent's terminal: a control sequence in them (clear the
    # screen, turn the text red) is shown escaped, never sent to the terminal
    # (named after one of the job's nodes, as the rendezvous state on the same store says:
    # announcements by anyone else are refused)
    forged = json.dumps({"exit_code": code, "node": _a_participant(store, "forged"),
                         "reason": "\x1b[2J\x1b[1;31m" + "x" * 100_000})
    store.compare_set("fsm_agent/job/forged/outcome", "", forged)
    # as an announcement does, wake the agents' watches (fsm_agent._core._job.OutcomeWatch): an
    # outcome written without it is read at a watch's re-arm or the next rendezvous
    watchers = store.add("fsm_agent/job/forged/watchers", 0)
    assert watchers == 2, watchers  # each agent watches
    for i in range(1, watchers + 1):
        store.set(f"fsm_agent/job/forged/wake/{i}", "forged")
    rcs = a.wait(60), b.wait(60)
    assert rcs == (1, 1), (a.output + b.output)[-4000:]
    for job in (a, b):
        last = job.final_message()
        assert f"announced exit code {code} is no failure's" in last, last
        assert len(last) < 2500, len(last)  # the reason is cut to what a line can hold
        assert "\x1b" not in job.output and "\\x1b[2J\\x1b[1;31mxxx" in last, last
