"""Reliability test worker. Imports torch only on the paths that need it, so it starts fast.

Writes ``a{attempt}_r{rank}_{event}.json`` into OUT_DIR (pid, child pid, time, elastic env):
``start`` when it starts, ``term`` when it receives SIGTERM (if TRAP_TERM is set).

Environment:
  FAIL_RANK      global rank that fails, once every rank of the attempt has started ...
  FAIL_ATTEMPTS  ... on these restart counts ("all", or comma-separated; default "all")
  FAIL_HOW       exit:N (exit code N), sigkill, segv (a real segfault via ctypes), raise (a
                 ValueError(MESSAGE) under torch's @record, which writes the error file); a
                 comma-separated list gives one per attempt (the last one repeats)
  HANG_RANK      global rank that stops making progress ... (HANG_ATTEMPTS, like FAIL_ATTEMPTS)
  STEP_TIMEOUT   ... while each step runs under torch's ``expires(after=STEP_TIMEOUT)`` with a
                 FileTimerClient, when the agent provides TORCHELASTIC_TIMER_FILE (default 1.5)
  STEPS          steps a healthy rank runs (0.05 s each; default 0)
  SLEEP          seconds a non-failing rank sleeps before finishing (default 0) ...
  SLEEP_GROUP_RANK ... only on this group rank (default: on every one)
  SPAWN_CHILD    "1": start a sleeping grandchild process and record its pid
  TRAP_TERM      "ignore": record SIGTERM and keep running (the agent must SIGKILL us after its
                 shutdown timeout); "record": record it and exit 143
"""

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

ENV_KEYS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_TIMER_FILE", "MASTER_ADDR", "MASTER_PORT")

env = os.environ
RANK = int(env["RANK"])
ATTEMPT = int(env["TORCHELASTIC_RESTART_COUNT"])
RECORD: dict = {k: env.get(k) for k in ENV_KEYS}
RECORD["pid"] = os.getpid()


def write(event: str, **extra: object) -> None:
    data = dict(RECORD, event=event, time=time.time(), **extra)
    out = os.path.join(env["OUT_DIR"], f"a{ATTEMPT}_r{RANK}_{event}.json")
    with open(out + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(out + ".tmp", out)


def selected(rank_var: str, attempts_var: str) -> bool:
    if env.get(rank_var) is None or int(env[rank_var]) != RANK:
        return False
    attempts = env.get(attempts_var, "all")
    return attempts == "all" or str(ATTEMPT) in attempts.split(",")


def fail(how: str) -> int:
    if how.startswith("exit:"):
        return int(how.split(":", 1)[1])
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "segv":
        ctypes.string_at(0)  # a genuine NULL dereference: SIGSEGV from the kernel
    if how == "raise":
        from torch.distributed.elastic.multiprocessing.errors import record

        @record
        def main() -> None:
            raise ValueError(env.get("MESSAGE", "deliberate failure"))

        main()
    raise SystemExit(f"unknown FAIL_HOW {how!r}")


def wait_for_peers(timeout: float = 30.0) -> None:
    """Fail only once every rank of this attempt has started (and recorded its child), so the
    tests know every pid of the attempt, whatever the scheduling."""
    import glob

    pattern = os.path.join(env["OUT_DIR"], f"a{ATTEMPT}_r*_start.json")
    deadline = time.monotonic() + timeout
    while len(glob.glob(pattern)) < int(env["WORLD_SIZE"]) and time.monotonic() < deadline:
        time.sleep(0.01)


def step_guard():
    """torch's hang timer around one step, if the agent runs a timer server."""
    timer_file = env.get("TORCHELASTIC_TIMER_FILE")
    if not timer_file:
        return contextlib.nullcontext()
    from torch.distributed.elastic.timer import FileTimerClient, configure, expires

    configure(FileTimerClient(timer_file))
    return expires(after=float(env.get("STEP_TIMEOUT", "1.5")))


def main() -> int:
    trap = env.get("TRAP_TERM")
    if trap:
        def on_term(signum: int, frame: object) -> None:
            write("term")
            if trap == "record":
                os._exit(143)

        signal.signal(signal.SIGTERM, on_term)
    if env.get("SPAWN_CHILD") == "1":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        RECORD["child_pid"] = child.pid
    write("start")
    if selected("FAIL_RANK", "FAIL_ATTEMPTS"):
        wait_for_peers()
        hows = env.get("FAIL_HOW", "exit:1").split(",")
        return fail(hows[min(ATTEMPT, len(hows) - 1)])
    hang = selected("HANG_RANK", "HANG_ATTEMPTS")
    for _ in range(int(env.get("STEPS", "0"))):
        with step_guard():
            time.sleep(600 if hang else 0.05)
    if hang:
        with step_guard():
            time.sleep(600)
    sleep_group = env.get("SLEEP_GROUP_RANK")
    sleep = float(env.get("SLEEP", "0")) if sleep_group in (None, env["GROUP_RANK"]) else 0.0
    deadline = time.monotonic() + sleep
    while time.monotonic() < deadline:  # a loop: a trapped SIGTERM must not end the sleep
        time.sleep(max(0.0, min(1.0, deadline - time.monotonic())))
    write("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
