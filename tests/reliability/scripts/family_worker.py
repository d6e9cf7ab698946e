"""A worker with a family, as a real trainer has: a ``sleep`` child, a forked Python child (a
dataloader worker) and a double-forked ``setsid`` daemon, none of which a process-group kill of
the worker reaches in full. Writes ``a{attempt}_r{rank}.json`` (its pid and its family's) into
OUT_DIR, then sleeps; with FAIL_ATTEMPT=N it exits 1 on attempt N instead, family left behind
(with GATE=1 only once the file ``gate`` exists in OUT_DIR); with EXIT_AFTER=S it exits 0 after
S seconds, family left behind."""

import json
import os
import subprocess
import sys
import time

env = os.environ
attempt = int(env["TORCHELASTIC_RESTART_COUNT"])
family = [subprocess.Popen(["sleep", "300"]).pid]
pid = os.fork()
if pid == 0:
    time.sleep(300)
    os._exit(0)
family.append(pid)
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        time.sleep(300)
        os._exit(0)
    os._exit(0)
family.append(int(os.read(r, 32)))
path = os.path.join(env["OUT_DIR"], f"a{attempt}_r{env['RANK']}.json")
with open(path + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "family": family, "time": time.time()}, f)
os.replace(path + ".tmp", path)
if env.get("FAIL_ATTEMPT") == str(attempt):
    # once every rank of the attempt has its family (else torch stops one mid-way)
    prefix = f"a{attempt}_r"
    gate = os.path.join(env["OUT_DIR"], "gate")
    while sum(n.startswith(prefix) and n.endswith(".json") for n in os.listdir(env["OUT_DIR"])) \
            < int(env["LOCAL_WORLD_SIZE"]) or (env.get("GATE") == "1" and not os.path.exists(gate)):
        time.sleep(0.02)
    sys.exit(1)
time.sleep(float(env.get("EXIT_AFTER", "300")))
