"""Worker for the lost-node tests: gloo all_reduce in a loop, as a training step would.

Once its process group works (one all_reduce done), writes ``slot_{pid}.json`` into OUT_DIR
(as slot_worker), then all_reduces every 50 ms until any rank sees the file STOP_FILE (at most
120 s): all ranks leave the loop together and exit 0. A peer that is lost makes the next
all_reduce fail (its connection closes): exit 1.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from slot_worker import write_record  # this script's directory is on sys.path

env = os.environ
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
flag = torch.zeros(1)
dist.all_reduce(flag)
write_record()
deadline = time.monotonic() + 120
while True:
    stop = os.path.exists(env["STOP_FILE"]) or time.monotonic() > deadline
    flag.fill_(1.0 if stop else 0.0)
    dist.all_reduce(flag)
    if flag.item() > 0:
        break
    time.sleep(0.05)
dist.destroy_process_group()
