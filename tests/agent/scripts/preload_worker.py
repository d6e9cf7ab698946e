"""Test worker for warm starts (``--preload``): records everything a process can see of how it
was started, prints to stdout and stderr, then behaves as told. Run cold and forked from a
template, the records and output files must be the same (tests/agent/test_preload.py).

Environment read (besides torch's):
  OUT_DIR       where ``attempt{N}_rank{R}.json`` goes
  IMPORT        a module to import first (``torch``: what --preload saves)
  SCRIPT_MODE   what rank 1 does: "raise" (an uncaught ValueError: traceback, exit 1),
                "record" (a ValueError under torch's @record: the error file), "exit:N",
                "ok"; one per attempt, comma-separated (the last repeats). Rank 0 waits until
                rank 1 (if any) has written its record, then sleeps SLEEP seconds (it is stopped
                by the agent when rank 1 fails) and finishes.
"""

import importlib
import json
import os
import random
import signal
import stat
import sys
import time

if os.environ.get("IMPORT"):
    importlib.import_module(os.environ["IMPORT"])

SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGPIPE", "SIGCHLD", "SIGUSR1", "SIGXFSZ")


def _fd(fd: int) -> str:
    try:
        st = os.fstat(fd)
    except OSError:
        return "closed"
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        target = "?"
    kind = "file" if stat.S_ISREG(st.st_mode) else "other"
    return f"{kind}:{target if kind == 'file' else os.path.basename(target).split(':')[0]}"


def _open_fds() -> list[int]:
    listed = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2]
    return [fd for fd in listed if _fd(fd) != "closed"]  # not the listing's own descriptor


def _disposition(name: str) -> str:
    handler = signal.getsignal(getattr(signal, name))
    return {signal.SIG_DFL: "default", signal.SIG_IGN: "ignore"}.get(
        handler, getattr(handler, "__name__", repr(handler)))


def snapshot() -> dict[str, object]:
    main = sys.modules["__main__"]
    torch = sys.modules.get("torch")
    return {
        "env": dict(os.environ),
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "main": {k: (v if isinstance(v, (str, type(None))) else type(v).__name__)
                 for k, v in vars(main).items() if k.startswith("__")},
        "own_session": os.getsid(0) == os.getpid() == os.getpgid(0),
        "signals": {name: _disposition(name) for name in SIGNALS},
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "fds": _open_fds(),
        "stdio": [_fd(0), _fd(1), _fd(2)],
        "stdout": [sys.stdout.line_buffering, sys.stdout.write_through, sys.stdout.encoding],
        "umask": os.umask(os.umask(0)),
        "random": random.random(),
        "torch_seed": torch.initial_seed() if torch is not None else None,
    }


def fail_recorded() -> None:
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def fail() -> None:
        raise ValueError("recorded failure")

    fail()


def main() -> None:
    env = os.environ
    rank, attempt = int(env["RANK"]), int(env["TORCHELASTIC_RESTART_COUNT"])
    out = os.path.join(env["OUT_DIR"], f"attempt{attempt}_rank{rank}.json")
    with open(out + ".tmp", "w") as f:
        json.dump(snapshot(), f)
    os.rename(out + ".tmp", out)
    print(f"hello from rank {rank} attempt {attempt}")
    print(f"warning from rank {rank} attempt {attempt}", file=sys.stderr)
    modes = env.get("SCRIPT_MODE", "ok").split(",")
    mode = modes[min(attempt, len(modes) - 1)]
    if rank == 0 and int(env["WORLD_SIZE"]) > 1:
        peer = os.path.join(env["OUT_DIR"], f"attempt{attempt}_rank1.json")
        deadline = time.monotonic() + 60
        while not os.path.exists(peer) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(float(env.get("SLEEP", "0")))
        return
    if rank == 0:
        return
    # Fail only once rank 0 has written its record: torch stops it as soon as this rank fails,
    # and a record that a slower start did not get to write would differ between runs.
    peer = os.path.join(env["OUT_DIR"], f"attempt{attempt}_rank0.json")
    deadline = time.monotonic() + 60
    while not os.path.exists(peer) and time.monotonic() < deadline:
        time.sleep(0.02)
    if mode == "raise":
        raise ValueError(f"uncaught failure in attempt {attempt}")
    if mode == "record":
        fail_recorded()
    if mode.startswith("exit:"):
        sys.exit(int(mode.split(":")[1]))


if __name__ == "__main__":
    main()
