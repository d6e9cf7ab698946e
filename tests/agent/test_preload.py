"""Warm starts (``fsm-agent run --preload``) against cold starts, with real jobs.

The same job runs cold and with ``--preload``; what its workers record about how they were
started (environment, arguments, working directory, ``sys.path[0]``, ``__main__``, session and
process group, signal dispositions and mask, open descriptors, stdio, umask), the files torch
writes for them (redirected stdout/stderr, error files), what ``--tee`` with
``--local-ranks-filter`` shows, and how their failures are reported (exit codes, tracebacks, the
root-cause summary, a peer stopped by SIGTERM) must be the same. Only what a fork cannot share is
allowed to differ, and is checked for what it must be instead: the parent (the template, not the
agent) and the random seeds (fresh per worker in both).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from fsm_torch_helpers import FAST, Job, Jobs, summary

SCRIPTS = Path(__file__).parent / "scripts"
WORKER = SCRIPTS / "preload_worker.py"
EXIT_WORKER = SCRIPTS / "exit_worker.py"
# Different for every job by nature (ports, ids, times, pids, the job's own directory).
VOLATILE_ENV = ("TORCHELASTIC_RUN_ID", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE",
                "FSM_AGENT_SENTINEL", "FSM_AGENT_WORKER", "FSM_AGENT_PROGRESS_DIR")


def _job(jobs: Jobs, name: str, env: dict[str, str], *extra: str) -> Job:
    workdir = jobs.tmp_path / name
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--spec", "torchrun",
            *FAST, "--redirects", "3", "--tee", "3", "--local-ranks-filter", "0",
            "--log-dir", str(workdir / "logs"), *extra]
    return jobs.start(args, WORKER, env=env, name=name)


def _normalize(text: str, job: Job) -> str:
    text = text.replace(str(job.workdir), "<WD>")
    text = re.sub(r"/logs/[^/\s\"']+/attempt_", "/logs/<RUN>/attempt_", text)
    text = re.sub(r"(pid|PID)([:= ]+)\d+", r"\1\2<PID>", text)
    text = re.sub(r"\d{4}-\d\d-\d\d[_ T]\d\d:\d\d:\d\d(\.\d+)?", "<TIME>", text)
    text = re.sub(r'"timestamp": "\d+"', '"timestamp": "<T>"', text)
    return text


def _records(job: Job) -> dict[str, dict[str, object]]:
    out = {}
    for path in sorted(job.out_dir.glob("attempt*_rank*.json")):
        rec = json.loads(_normalize(path.read_text(), job))
        for key in VOLATILE_ENV:
            rec["env"].pop(key, None)  # type: ignore[attr-defined]
        out[path.stem] = rec
    return out


def _files(job: Job) -> dict[str, str]:
    logs = job.workdir / "logs"
    return {
        re.sub(r"^[^/]+/", "<RUN>/", str(p.relative_to(logs))): _normalize(p.read_text(), job)
        for p in sorted(logs.rglob("*")) if p.is_file()
    }


def _tee(job: Job) -> list[str]:
    # stdout and stderr are tailed by two threads: their lines interleave as they come
    return sorted(_normalize(line, job) for line in job.output.splitlines()
                  if line.startswith("[default"))


def _summary(job: Job) -> str:
    """torch's failure summary (ChildFailedError's block between two rules of '=')."""
    lines = job.output.splitlines()
    root = next(i for i, line in enumerate(lines) if line.startswith("Root Cause"))
    rules = [i for i, line in enumerate(lines) if line.startswith("=====")]
    start = max(i for i in rules if i < root)
    end = min(i for i in rules if i > root)
    block = _normalize("\n".join(lines[start : end + 1]), job)
    return re.sub(r"host\s*:\s*\S+", "host: <HOST>", block)


@pytest.mark.timeout(180)
def test_a_preloaded_torch_restart_is_a_cold_start_to_the_worker(jobs: Jobs) -> None:
    # Attempt 0: rank 1 dies of an uncaught exception (traceback, exit 1), the job restarts.
    # Attempt 1: rank 1 fails under @record (error file); the job gives up, rank 0 is stopped.
    env = {"IMPORT": "torch", "SCRIPT_MODE": "raise,record", "SLEEP": "60"}
    cold = _job(jobs, "cold", env)
    assert cold.wait(120) == 1, cold.output[-3000:]
    warm = _job(jobs, "warm", env, "--preload", "torch")
    assert warm.wait(120) == 1, warm.output[-3000:]

    assert "--preload torch: imported in" in warm.output  # the template served the workers
    # launched by `fsm-agent run` before it imported torch (fsm_agent/cli/_prestart.py)
    assert "importing since the agent started" in warm.output
    assert "--preload" not in cold.output
    cold_recs, warm_recs = _records(cold), _records(warm)
    assert sorted(cold_recs) == sorted(warm_recs) == [
        "attempt0_rank0", "attempt0_rank1", "attempt1_rank0", "attempt1_rank1"]
    for recs in (cold_recs, warm_recs):  # each process drew its own seeds
        for key in ("random", "torch_seed"):
            values = [rec.pop(key) for rec in recs.values()]
            assert len(set(values)) == len(values), (key, values)
    assert warm_recs == cold_recs

    assert _files(warm) == _files(cold)
    assert any("uncaught failure in attempt 0" in text and "Traceback" in text
               for text in _files(cold).values())
    assert any(name.endswith("error.json") and "recorded failure" in text
               for name, text in _files(cold).items())
    assert _tee(warm) == _tee(cold) and _tee(cold)
    assert _summary(warm) == _summary(cold)
    assert "SIGTERM" in _summary(cold) and "recorded failure" in _summary(cold)


def test_preload_flag_names_bad_modules(jobs: Jobs) -> None:
    job = jobs.start(["--standalone", "--preload", "torch,not-a-module"], WORKER)
    assert job.wait(60) == 2
    assert "--preload: 'not-a-module' is not a module name" in job.output


@pytest.mark.timeout(60)
def test_a_module_that_cannot_be_preloaded_is_one_line_then_a_cold_start(jobs: Jobs) -> None:
    job = _job(jobs, "missing", {"SCRIPT_MODE": "ok"}, "--preload", "json,no_such_module_fsm")
    assert job.wait(60) == 0, job.output[-3000:]
    lines = [line for line in job.output.splitlines()  # not the INFO lines (LOGLEVEL=INFO)
             if "--preload" in line and not re.match(r"I[\d ]", line)]
    assert len(lines) == 1, lines
    assert "cannot import no_such_module_fsm (ModuleNotFoundError" in lines[0]
    assert lines[0].endswith("workers start cold")
    assert len(job.records()) == 2


@pytest.mark.timeout(60)
def test_a_module_that_starts_a_thread_is_refused(jobs: Jobs, tmp_path: Path) -> None:
    (tmp_path / "threaded_mod.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), name='busy', daemon=True).start()\n")
    job = jobs.start(["--standalone", "--nproc-per-node", "1", *FAST, "--preload",
                      "threaded_mod"], WORKER, env={"PYTHONPATH": str(tmp_path)})
    assert job.wait(60) == 0, job.output[-3000:]
    assert "--preload threaded_mod: the modules started Python threads (busy)" in job.output


@pytest.mark.timeout(60)
def test_a_worker_that_is_not_a_python_script_starts_cold(jobs: Jobs) -> None:
    job = jobs.start(["--standalone", "--nproc-per-node", "1", *FAST, "--no-python",
                      "--preload", "json"], "sh", ["-c", "echo started"])
    assert job.wait(60) == 0, job.output[-3000:]
    assert "--preload json: the workers are not started as a Python script" in job.output
    assert "started" in job.output


@pytest.mark.timeout(90)
def test_a_module_worker_matches_its_cold_start(jobs: Jobs) -> None:
    """``-m MODULE`` workers (no torch import: quick): same records and files, warm or cold."""
    env = {"SCRIPT_MODE": "exit:7,ok", "PYTHONPATH": str(SCRIPTS)}
    runs = {}
    for name, extra in (("cold", ()), ("warm", ("--preload", "json,email.message"))):
        workdir = jobs.tmp_path / name
        job = jobs.start(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                          *FAST, "--redirects", "3", "--log-dir", str(workdir / "logs"),
                          *extra, "-m"], "preload_worker", env=env, name=name)
        assert job.wait(60) == 0, job.output[-3000:]
        recs = _records(job)
        for rec in recs.values():
            del rec["random"], rec["torch_seed"]
        runs[name] = (recs, _files(job), job)
    assert "--preload json,email.message: imported in" in runs["warm"][2].output
    assert runs["warm"][0] == runs["cold"][0]
    assert runs["warm"][1] == runs["cold"][1]
    assert runs["cold"][0]["attempt0_rank0"]["argv"][0].endswith("preload_worker.py")


@pytest.mark.timeout(60)
def test_a_signal_to_the_agent_stops_forked_workers_and_the_template(jobs: Jobs) -> None:
    job = jobs.start(["--standalone", "--nproc-per-node", "2", *FAST, "--preload", "json"],
                     WORKER, env={"SLEEP": "60", "SCRIPT_MODE": "ok"})
    job.wait_for("attempt0_rank*.json", 2, 40)
    assert "--preload json: imported in" in job.output
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(30) == 128 + signal.SIGTERM, job.output[-3000:]
    # the jobs fixture fails the test if a worker or the template outlived the agent


# A worker that waits for $GO, prints "done" and exits with $CODE_<rank> (default 0).
WAIT_FOR_GO = """\
import os, sys, time
import json  # preloaded by the tests
if os.environ.get("IMPORT"):
    __import__(os.environ["IMPORT"])
start = os.path.join(os.environ["OUT_DIR"], "start_" + os.environ["RANK"])
open(start + ".tmp", "w").write("{}")
os.replace(start + ".tmp", start)  # the test reads it: never half-written
if os.environ.get("KILL_SELF"):
    os.kill(os.getpid(), 15)
    time.sleep(30)
while not os.path.exists(os.environ["GO"]):
    time.sleep(0.05)
print("done", flush=True)
out = os.environ["OUT_DIR"]
open(os.path.join(out, "done_" + os.environ["RANK"]), "w").close()
code = int(os.environ.get("CODE_" + os.environ["RANK"], "0"))
if code:
    # a failing rank fails after the others are done: torch stops the group at the first
    # failure, and a rank stopped before it printed would not be a test of exit statuses
    others = [os.path.join(out, f"done_{r}") for r in range(int(os.environ["WORLD_SIZE"]))]
    while not all(os.path.exists(p) for p in others):
        time.sleep(0.05)
sys.exit(code)
"""


def _template_pid(job: Job) -> int:
    m = re.search(r"--preload \S+: template pid (\d+) importing", job.output)
    assert m, job.output[-3000:]
    return int(m.group(1))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("codes", [{}, {"CODE_1": "3"}], ids=["both-succeed", "rank1-exits-3"])
def test_workers_keep_their_exit_status_when_the_template_dies(
        jobs: Jobs, tmp_path: Path, codes: dict[str, str]) -> None:
    script = tmp_path / "go_worker.py"
    script.write_text(WAIT_FOR_GO)
    go = tmp_path / "go"
    job = jobs.start(["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", *FAST,
                      "--preload", "json"], script, env={"GO": str(go), **codes})
    job.wait_for("start_*", 2, 60)
    template = _template_pid(job)
    os.kill(template, signal.SIGKILL)  # the OOM killer, a stray pkill
    time.sleep(0.5)
    go.touch()
    rc = job.wait(60)
    out = job.output
    assert out.count("done") >= 2, out[-3000:]
    assert "--preload json: the template exited" in out, out[-3000:]  # noticed and said
    if not codes:
        assert rc == 0, out[-3000:]
        assert "exitcode" not in out, out[-3000:]
    else:
        assert rc == 1, out[-3000:]
        root = summary(out)["root"]
        assert root["rank"] == "1" and root["exitcode"] == "3", out[-3000:]  # type: ignore[index]


@pytest.mark.timeout(90)
def test_a_preloaded_modules_signal_handler_runs_in_warm_workers_as_in_cold_ones(
        jobs: Jobs, tmp_path: Path) -> None:
    # The module installs a checkpoint-on-SIGTERM handler at import (exit 42); the worker
    # then receives SIGTERM. Warm must equal cold: 42, not death by SIGTERM.
    (tmp_path / "ckpt_on_term.py").write_text(
        "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n")
    script = tmp_path / "go_worker.py"
    script.write_text(WAIT_FOR_GO)
    env = {"GO": str(tmp_path / "never"), "IMPORT": "ckpt_on_term", "KILL_SELF": "1",
           "PYTHONPATH": str(tmp_path)}
    roots = {}
    for name, extra in (("cold", ()), ("warm", ("--preload", "ckpt_on_term"))):
        job = jobs.start(["--standalone", "--nproc-per-node", "1", "--max-restarts", "0",
                          *FAST, *extra], script, env=env, name=name)
        assert job.wait(60) == 1, job.output[-3000:]
        roots[name] = summary(job.output)["root"]["exitcode"]  # type: ignore[index]
        if extra:
            assert "--preload ckpt_on_term: imported in" in job.output
    assert roots == {"cold": "42", "warm": "42"}


@pytest.mark.timeout(60)
def test_a_module_that_hangs_at_import_is_given_up_and_what_it_started_ends(
        tmp_path: Path) -> None:
    # A real template (the agent's Template, no job around it): the module starts a child,
    # then never finishes importing. Start-up blocked for ever before.
    import sys

    from fsm_agent.torch._preload import Template

    child = tmp_path / "child.pid"
    (tmp_path / "hangs_at_import.py").write_text(
        "import os, subprocess, time\n"
        f"p = subprocess.Popen(['sleep', '300']); open({str(child)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(300)\n")
    script = tmp_path / "w.py"
    script.write_text("")
    started = time.monotonic()  # the timeout counts from the template's creation
    template = Template(["hangs_at_import"], sys.executable, ["-u"], [str(script)],
                        import_timeout=3)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tmp_path)
    try:
        template.start()
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    assert template.wait_ready() is False
    assert 3 <= time.monotonic() - started < 10
    assert template.failed is not None and "did not import within 3 s" in template.failed
    assert template.proc is not None and template.proc.returncode is not None  # killed, reaped
    pid = int(child.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")  # the module's child went with it


@pytest.mark.timeout(180)
def test_a_forked_workers_fast_exit_loses_no_redirected_or_teed_output(jobs: Jobs) -> None:
    # tests/agent/test_preload_exit.py checks the fast exit against a cold one without an
    # agent; here the output goes through torch's redirect files and the agent's --tee.
    def job(name: str, *extra: str) -> tuple[int, dict[str, str], list[str]]:
        workdir = jobs.tmp_path / name
        args = ["--standalone", "--nproc-per-node", "1", "--max-restarts", "0", "--spec",
                "torchrun", *FAST, "--redirects", "3", "--tee", "3", "--log-dir",
                str(workdir / "logs"), *extra]
        run = jobs.start(args, EXIT_WORKER, name=name,
                         env={"MODE": "exit:3", "SIDE_FILE": str(workdir / "s")})
        code = run.wait(120)
        logs = {p.name: p.read_text() for p in sorted((workdir / "logs").rglob("std*.log"))}
        # The agent tees stdout and stderr from two threads into one captured stream, so a
        # text without a newline may have the other stream's next line appended to it: compare
        # what each "[default0]:" prefix introduced, in either order.
        tee = [part for line in run.output.splitlines() if line.startswith("[default0]:")
               for part in line.split("[default0]:")[1:]]
        return code, logs, sorted(tee)

    cold = job("cold")
    warm = job("warm", "--preload", "torch")
    assert warm == cold
    code, logs, tee = warm
    assert code == 1
    assert "C stdio text without a newline" in logs["stdout.log"]
    for line in ("python stdout text, still in its buffer", "atexit handler: stdout"):
        assert line in logs["stdout.log"] and line in tee
    assert "atexit handler: stderr" in logs["stderr.log"] and "atexit handler: stderr" in tee


@pytest.mark.timeout(90)
def test_the_early_template_serves_when_the_caller_exported_an_agent_variable(jobs: Jobs) -> None:
    # TORCHELASTIC_SIGNALS_TO_HANDLE is the agent's own (torch's launcher sets it): a caller
    # that exported it, or that ran torch's launcher in its own process before, must not cost
    # the agent the template `fsm-agent run` launched before it imported torch.
    job = jobs.start(["--standalone", "--nproc-per-node", "2", *FAST, "--preload", "json"],
                     WORKER, env={"SCRIPT_MODE": "ok",
                                  "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT"})
    assert job.wait(60) == 0, job.output[-3000:]
    assert "--preload json: template pid" in job.output, job.output
    assert "importing since the agent started" in job.output, job.output
    assert len(job.records("attempt0_rank*.json")) == 2


@pytest.mark.timeout(90)
def test_a_template_launched_for_a_wrong_guess_of_the_script_is_ended(jobs: Jobs) -> None:
    # `fsm-agent run` guesses the script without torch's parser, to launch the template before
    # it imports torch: here the first existing .py file on the command line is an option's
    # value. The early template is not the one the agent needs: the agent launches its own,
    # and the early one is ended (the jobs fixture fails the test if it outlived the job; it
    # carries the sentinel's token, and ends itself too when its control socket closes).
    decoy = jobs.tmp_path / "decoy.py"
    decoy.write_text("")
    job = jobs.start(["--standalone", "--nproc-per-node", "2", *FAST, "--rdzv-id", str(decoy),
                      "--preload", "json"], WORKER, env={"SCRIPT_MODE": "ok"})
    assert job.wait(60) == 0, job.output[-3000:]
    assert re.search(r"--preload json: template pid \d+ importing\n", job.output), job.output
    assert "since the agent started" not in job.output
    assert len(job.records("attempt0_rank*.json")) == 2
