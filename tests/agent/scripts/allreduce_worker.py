"""Worker for the lost-node tests: gloo all_reduce in a loop, as a training step would.

Once its process group works (one all_reduce done), writes ``slot_{pid}.json`` into OUT_DIR
(as slot_worker), then all_reduces every 50 ms until any rank sees the file STOP_FILE (at most
120 s): all ranks leave the loop together and exit 0. A peer that is lost makes the next
all_reduce fail (its connection closes): exit 1. With FAIL_CODE set (quarantine_worker's
gates), the worker exits with that code once GATE_DIR/fail_<attempt> exists, the attempt being
the number of records this node's workers wrote before: its peers' next all_reduce fails.
"""

import glob
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from slot_worker import write_record  # this script's directory is on sys.path

env = os.environ
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
flag = torch.zeros(1)
dist.all_reduce(flag)
attempt = len(glob.glob(os.path.join(env["OUT_DIR"], "slot_*.json")))
write_record()
code = int(env.get("FAIL_CODE", "0"))
gate = os.path.join(env.get("GATE_DIR", ""), f"fail_{attempt}")
deadline = time.monotonic() + 120
while True:
    if code and os.path.exists(gate):
        sys.exit(code)
    stop = os.path.exists(env["STOP_FILE"]) or time.monotonic() > deadline
    flag.fill_(1.0 if stop else 0.0)
    dist.all_reduce(flag)
    if flag.item() > 0:
        break
    time.sleep(0.05)
dist.destroy_process_group()
