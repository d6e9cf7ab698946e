"""Test worker (no torch import, so it starts fast): records its environment, then behaves as told.

Environment read (besides torch's):
  OUT_DIR          where to write ``attempt{TORCHELASTIC_RESTART_COUNT}_rank{RANK}.json`` (the
                   worker's elastic environment plus pid and finish time)
  FAIL_RANKS       comma-separated global ranks that exit with FAIL_CODE ...
  FAIL_ATTEMPTS    ... on these restart counts ("all" = every attempt; default "all")
  FAIL_CODE        exit code of a failing rank (default 1)
  FAIL_LAST        "1": a failing rank first waits (up to 30 s) until every other rank of its
                   attempt has finished and exited, so which ranks failed does not depend on
                   timing
  SLEEP            seconds to sleep before finishing (default 0)
  SLEEP_GROUP_RANK only sleep on this group rank (default: every rank sleeps)
  UNTIL_WORLD_SIZE sleep forever unless WORLD_SIZE equals it (membership-change tests)
  SPAWN_CHILD      "1": start a sleeping child process and record its pid (signal tests)
  PROBE_RANKS      comma-separated ranks that connect to the workers' store
                   (MASTER_ADDR:MASTER_PORT, as init_process_group does), record whether a key
                   of an earlier attempt is visible, then write this attempt's key
"""

import json
import os
import subprocess
import sys
import time

KEYS = (
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
)


def _exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def _finished(path: str) -> bool:
    # Finished *and* exited: an agent that notices our failure at once would otherwise stop a
    # peer still on its way out, and count it as a failure (-15) that depends on timing.
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return False
    return "finished" in rec and _exited(int(rec["pid"]))


def main() -> int:
    env = os.environ
    rank = int(env["RANK"])
    attempt = int(env["TORCHELASTIC_RESTART_COUNT"])
    out = os.path.join(env["OUT_DIR"], f"attempt{attempt}_rank{rank}_ws{env['WORLD_SIZE']}.json")
    record = {k: env.get(k) for k in KEYS}
    record["pid"] = os.getpid()
    if env.get("SPAWN_CHILD") == "1":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        record["child_pid"] = child.pid

    def write(**extra: object) -> None:
        record.update(extra)
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, out)

    if str(rank) in env.get("PROBE_RANKS", "").split(","):
        from datetime import timedelta

        import torch.distributed as dist

        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=20))
        earlier = [f"probe/{a}" for a in range(attempt)]
        record["saw_earlier_attempt"] = any(store.check([k]) for k in earlier)
        store.set(f"probe/{attempt}", str(os.getpid()))
    write(started=time.time())
    until = env.get("UNTIL_WORLD_SIZE")
    if until and env["WORLD_SIZE"] != until:
        time.sleep(600)
    fail_ranks = {int(r) for r in env.get("FAIL_RANKS", "").split(",") if r}
    attempts = env.get("FAIL_ATTEMPTS", "all")
    fails_now = attempts == "all" or str(attempt) in attempts.split(",")
    if rank in fail_ranks and fails_now:
        if env.get("FAIL_LAST") == "1":
            world = int(env["WORLD_SIZE"])
            others = [os.path.join(env["OUT_DIR"],
                                   f"attempt{attempt}_rank{r}_ws{env['WORLD_SIZE']}.json")
                      for r in range(world) if r not in fail_ranks]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(_finished(f) for f in others):
                time.sleep(0.02)
        write(finished=time.time(), exit=int(env.get("FAIL_CODE", "1")))
        return int(env.get("FAIL_CODE", "1"))
    sleep_group = env.get("SLEEP_GROUP_RANK")
    if sleep_group is None or sleep_group == env["GROUP_RANK"]:
        time.sleep(float(env.get("SLEEP", "0")))
    write(finished=time.time(), exit=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
