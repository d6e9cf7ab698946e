"""Fails on every attempt: the agent gives up after max_restarts."""
import os
import sys

print(f"rank {os.environ['RANK']} attempt {os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
sys.exit(3)
