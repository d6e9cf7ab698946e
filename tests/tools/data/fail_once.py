"""Fails on the first attempt, succeeds after the agent restarts it."""
import os
import sys

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = os.environ["RANK"]
print(f"rank {rank} attempt {attempt}", flush=True)
sys.exit(1 if attempt == 0 else 0)
