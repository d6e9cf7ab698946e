"""docs/multinode.md's commands, as written, on loopback: two agents ("terminals") per scenario.

The commands are read from the guide's blocks marked ``<!-- test: NAME -->`` (one ``fsm-agent
run`` line per terminal); only the port, the checkpoint directory and the example's path are
replaced, so that a test never collides with another and the guide stays what users paste.
"""

from __future__ import annotations

import re
import shlex
import signal
from pathlib import Path

import pytest
from fsm_torch_helpers import EXAMPLES, Job, Jobs, free_port

GUIDE = Path(__file__).parents[2] / "docs" / "multinode.md"


def _commands(name: str, port: int, ckpt: Path) -> list[list[str]]:
    """The guide's ``fsm-agent run`` arguments of block ``name``, one list per terminal."""
    text = GUIDE.read_text()
    m = re.search(rf"<!-- test: {name} -->\n```bash\n(.*?)```", text, re.S)
    assert m, f"{GUIDE}: no block marked test: {name}"
    out = []
    for line in m.group(1).splitlines():
        if not line.startswith("fsm-agent run "):
            continue
        args = shlex.split(line)[2:]
        args = [a.replace("localhost:29400", f"localhost:{port}") for a in args]
        args = [str(EXAMPLES / "train_ddp.py") if a == "examples/train_ddp.py" else a
                for a in args]
        i = args.index("--checkpoint-dir")
        args[i + 1] = str(ckpt)
        out.append(args)
    assert len(out) == 2, out
    return out


def _start(jobs: Jobs, args: list[str], name: str) -> Job:
    return jobs.start(args, None, name=name, env={"LOGLEVEL": "WARNING"})


@pytest.mark.timeout(120)
def test_fixed_size_two_nodes(jobs: Jobs, tmp_path: Path) -> None:
    first, second = _commands("fixed", free_port(), tmp_path / "ckpt")
    a, b = _start(jobs, first, "t1"), _start(jobs, second, "t2")
    assert a.wait(90) == 0, a.output
    assert b.wait(30) == 0, b.output
    for job, ranks in ((a, (0, 1)), (b, (2, 3))):
        for rank in ranks:
            assert f"[rank {rank}] attempt 0: world_size=4, resuming at epoch 0" in job.output
            assert f"[rank {rank}] epoch 3:" in job.output


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_elastic_a_node_joins_then_fails(jobs: Jobs, tmp_path: Path) -> None:
    first, second = _commands("elastic", free_port(), tmp_path / "ckpt")
    a = _start(jobs, first, "t1")
    a.wait_output("[rank 0] attempt 0: world_size=2", 90)  # alone: last call, then the start

    # a node joins: a membership restart, not counted
    b = _start(jobs, second, "t2")
    a.wait_output("world_size=4", 90)
    # which node gets ranks 0-1 is torch's choice (its rendezvous sorts the nodes by their
    # descriptors, pids included), not the order they came in
    b.wait_output("] epoch", 90)
    assert "nodes waiting to join; restarting the worker group" in a.output
    assert "worker group FAILED" not in a.output
    assert re.search(r"\[rank \d\] attempt 0: world_size=4, resuming at epoch \d+", a.output)

    # it fails (Ctrl-C): the other node restarts, counted, and finishes alone
    b.proc.send_signal(signal.SIGINT)
    assert b.wait(60) == 128 + signal.SIGINT, b.output
    assert a.wait(120) == 0, a.output
    assert "worker group FAILED; restart 1 of 3" in a.output
    resumed = re.findall(r"\[rank 0\] attempt 1: world_size=2, resuming at epoch (\d+)", a.output)
    assert resumed and int(resumed[0]) > 0, a.output  # from the checkpoint, not from scratch
    assert "[rank 0] epoch 19:" in a.output
