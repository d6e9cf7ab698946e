"""A worker dies (exit code, SIGKILL, segfault, exception under @record): the right rank is blamed,
its error file reaches the summary, and the restarts proceed. Real agent, real workers.

One job fails four times in a row, a different way on each attempt (which keeps the suite fast):
every attempt's FAILED observation is checked in the trace (the failures the engine saw, per
global rank), the last one in torch's failure summary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reliability_helpers import STANDALONE, Jobs, alive, summary, trace_records

# attempt -> (FAIL_HOW, exit code torch reports, signal name it shows)
FAULTS = [("exit:7", 7, None), ("sigkill", -9, "SIGKILL"), ("segv", -11, "SIGSEGV"),
          ("raise", 1, None)]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_each_fault_blames_the_failing_rank_and_restarts_proceed(
    jobs: Jobs, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    env = {"FAIL_RANK": "1", "FAIL_HOW": ",".join(how for how, _, _ in FAULTS),
           "MESSAGE": "boom-under-record", "SLEEP": "60", "SPAWN_CHILD": "1"}
    job = jobs.start([*STANDALONE, "--max-restarts", str(len(FAULTS) - 1), "--trace",
                      str(trace)], env=env)
    assert job.wait(140) == 1, job.output
    out = job.output
    # Restarts proceed: every attempt ran both ranks; the healthy rank 0 was stopped each time.
    starts = {(int(r["TORCHELASTIC_RESTART_COUNT"]), int(r["RANK"])): r  # type: ignore[call-overload]
              for r in job.records("*_start.json")}
    assert sorted(starts) == [(a, r) for a in range(len(FAULTS)) for r in (0, 1)], out
    for n in range(1, len(FAULTS)):
        assert f"restart {n} of {len(FAULTS) - 1}" in out, out
    assert not job.records("*_done.json")
    for rec in starts.values():
        # The crashed rank's own child too: torch leaves it running (fsm_agent.torch._reaper).
        assert not alive(int(rec["pid"])) and not alive(int(rec["child_pid"]))  # type: ignore[call-overload]

    # Each attempt: the failure the engine observed blames rank 1 with that attempt's fault.
    failed = [r for r in trace_records(trace) if r.get("observed") == "FAILED"
              and r.get("trigger") == "failed"]
    assert len(failed) == len(FAULTS), failed
    for attempt, (step, (how, code, signame)) in enumerate(zip(failed, FAULTS, strict=True)):
        failures = step["failures"]
        assert isinstance(failures, dict)
        blamed = failures["1"]
        assert blamed["exitcode"] == code, (how, blamed)
        assert blamed["pid"] == starts[(attempt, 1)]["pid"]
        if signame:
            pid = blamed["pid"]
            assert blamed["message"] == f"Signal {-code} ({signame}) received by PID {pid}"
        # torch also lists the ranks it stopped itself, as SIGTERM, for bookkeeping; never more.
        for rank, other in failures.items():
            if rank != "1":
                assert other["exitcode"] == -15, (how, failures)

    # The summary: root cause rank 1 with the last attempt's error file, written by @record.
    s = summary(out)
    assert s, out
    root = s["root"]
    assert isinstance(root, dict)
    assert root["rank"] == "1" and root["exitcode"] == "1", root
    assert f"pid: {starts[(len(FAULTS) - 1, 1)]['pid']})" in root["exitinfo"]
    path = Path(root["error_file"])
    assert str(path) == starts[(len(FAULTS) - 1, 1)]["TORCHELASTIC_ERROR_FILE"]
    assert "boom-under-record" in json.loads(path.read_text())["message"]["message"]
    assert "ValueError: boom-under-record" in out.rpartition("Root Cause")[2]
    for other in s["others"]:  # type: ignore[attr-defined]
        assert other["rank"] != "1" and other["exitcode"] == "-15", s
    # After torch's failure block only the run summary (docs/diagnosis.md): no traceback, and
    # it blames the rank torch blames, not one that torch stopped itself.
    tail = out.rpartition("=" * 60)[2]
    assert tail.lstrip().startswith("fsm-agent: job FAILED (spec 'torchelastic'"), tail
    assert "Traceback" not in tail, tail
    assert "\nroot cause: rank 1 (" in tail and "ValueError: boom-under-record" in tail, tail


# Rank 1 writes an error file torch cannot read, then exits 1: not UTF-8 on attempt 0, a
# `message` that is neither a string nor an object on attempt 1.
BAD_ERROR_FILE = """\
import os, sys, time
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if os.environ["RANK"] != "1":
    time.sleep(60)
with open(os.environ["TORCHELASTIC_ERROR_FILE"], "wb") as f:
    f.write(b"\\xff\\xfe not json" if attempt == 0 else b'{"message": 42}')
sys.exit(1)
"""


@pytest.mark.timeout(90)
def test_an_unreadable_error_file_is_a_failure_like_any_other(jobs: Jobs, tmp_path: Path) -> None:
    # torch re-raises what it cannot parse: the agent (torchrun's too) ended at the first
    # failure with its restarts unused and no rank named.
    script = tmp_path / "bad_error_file.py"
    script.write_text(BAD_ERROR_FILE)
    job = jobs.start([*STANDALONE, "--max-restarts", "1"], script)
    assert job.wait(80) == 1, job.output[-3000:]
    out = job.output
    assert "restart 1 of 1" in out, out[-3000:]
    assert "fsm-agent run: error:" not in out, out[-3000:]
    root = summary(out)["root"]
    assert root["rank"] == "1" and root["exitcode"] == "1", out[-3000:]  # type: ignore[index]
    assert root["error_file"] == "<N/A>", root  # type: ignore[index]
    assert root["traceback"].startswith("unreadable error file "), root  # type: ignore[index]
    assert "(TypeError: " in root["traceback"], root  # type: ignore[index]
    assert "(UnicodeDecodeError: " in out, out[-3000:]  # attempt 0's, in the log


def test_the_failure_of_an_unreadable_error_file_is_torchs_own_and_pickles(
        tmp_path: Path) -> None:
    # Results travel pickled (torch's own agent tests send them through a queue): a failure of
    # a class of ours would not arrive where fsm_agent is not importable, or at all.
    import pickle

    from torch.distributed.elastic.multiprocessing import api, errors

    from fsm_agent.torch._errorfiles import tolerant_error_files

    bad = tmp_path / "error.json"
    bad.write_bytes(b"\xff\xfe")
    with tolerant_error_files():
        failure = api.ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(bad))
    assert type(failure) is errors.ProcessFailure
    again = pickle.loads(pickle.dumps(failure))
    assert again.message.startswith(f"unreadable error file {bad} (UnicodeDecodeError")
    assert again.error_file == "<N/A>"
