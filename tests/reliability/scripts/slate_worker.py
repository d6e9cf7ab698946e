"""A worker that leaves a double-forked ``setsid`` daemon behind (out of its process group, so
neither torch's stop nor the reaper reaches it), as a trainer's helper service does.

Writes ``a{attempt}_r{rank}.json`` into OUT_DIR: its daemon's pid and, from attempt 1 on, the
state its predecessor's daemon was in when this worker started (``gone`` for no process, else
the state letter of ``/proc/PID/stat``). Attempt 0 exits 1 once every rank has written its
file and, with GATE=1, once the file ``gate`` exists in OUT_DIR (the test freezes the daemon
first); later attempts exit 0."""

import json
import os
import sys
import time

env = os.environ
out = env["OUT_DIR"]
attempt = int(env["TORCHELASTIC_RESTART_COUNT"])
rank = env["RANK"]


def state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            letter = f.read().rpartition(b")")[2].split()[0].decode()
    except OSError:
        return "gone"
    return "gone" if letter in ("Z", "X") else letter


record: dict[str, object] = {"pid": os.getpid()}
if attempt:
    with open(os.path.join(out, f"a{attempt - 1}_r{rank}.json")) as f:
        record["previous"] = state(int(json.load(f)["daemon"]))
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        time.sleep(300)
        os._exit(0)
    os._exit(0)
record["daemon"] = int(os.read(r, 32))
path = os.path.join(out, f"a{attempt}_r{rank}.json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
if attempt == 0:
    # once every rank has its daemon (else torch stops one mid-way) and the test has let it
    while sum(n.startswith("a0_r") and n.endswith(".json") for n in os.listdir(out)) \
            < int(env["WORLD_SIZE"]) or (env.get("GATE") == "1"
                                          and not os.path.exists(os.path.join(out, "gate"))):
        time.sleep(0.02)
    sys.exit(1)
