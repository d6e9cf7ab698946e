"""Security promises: what listens where under --standalone; spec and trace files are data only."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
from pathlib import Path

import pytest
from fsm_test_procs import listening_addresses
from reliability_helpers import FAST, STANDALONE, Jobs, free_port

from fsm_agent import SpecError, load_spec
from fsm_agent.trace._reader import read_trace
from fsm_agent.trace._schema import TraceError


def is_loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


@pytest.mark.timeout(60)
def test_the_listening_check_sees_torchs_wildcard_store() -> None:
    """The premise (and a check that can fail): a plain TCPStore listens on every interface."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    addrs = [a for a in listening_addresses(os.getpid()) if a[1] == store.port]
    assert addrs and not any(is_loopback(a) for a, _ in addrs), addrs
    del store


@pytest.mark.timeout(120)
def test_standalone_stores_listen_on_loopback_only(jobs: Jobs) -> None:
    job = jobs.start([*STANDALONE, "--shutdown-timeout", "3"], env={"SLEEP": "60"})
    recs = job.wait_for("a0_*_start.json", 2, 80)
    addrs = listening_addresses(job.pid)
    # The rendezvous store and the workers' store of the round, both in the agent.
    assert len(addrs) >= 2, addrs
    assert all(is_loopback(a) for a, _ in addrs), addrs
    ports = {p for _, p in addrs}
    for rec in recs:  # the workers are sent to their store on loopback
        assert rec["MASTER_ADDR"] == "127.0.0.1" and int(rec["MASTER_PORT"]) in ports, rec
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(15) == 128 + signal.SIGTERM


@pytest.mark.timeout(120)
def test_an_explicit_loopback_endpoint_listens_on_loopback_only(jobs: Jobs) -> None:
    """``--rdzv-endpoint localhost:PORT`` for two agents on this machine: one hosts the
    rendezvous store on that port, the other joins it; every store of both agents listens on
    loopback, and the workers are sent there."""
    port = free_port()
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "loopback",
            "--shutdown-timeout", "3", *FAST]
    agents = [jobs.start(args, env={"SLEEP": "60"}, name=f"agent{i}") for i in range(2)]
    recs = [r for job in agents for r in job.wait_for("a0_*_start.json", 1, 80)]
    addrs = {job.pid: listening_addresses(job.pid) for job in agents}
    assert all(is_loopback(a) for found in addrs.values() for a, _ in found), addrs
    assert sum(p == port for found in addrs.values() for _, p in found) == 1, addrs
    ports = {p for found in addrs.values() for _, p in found}
    for rec in recs:
        assert rec["MASTER_ADDR"] == "127.0.0.1" and int(rec["MASTER_PORT"]) in ports, rec
    for job in agents:
        job.proc.send_signal(signal.SIGTERM)
    for job in agents:
        assert job.wait(15) == 128 + signal.SIGTERM


def test_spec_yaml_tags_and_dotted_names_are_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    base = (Path(__file__).parents[2] / "specs" / "torchrun.yaml").read_text()
    tagged = tmp_path / "tagged.yaml"
    tagged.write_text(base.replace(
        "description:", f"x: !!python/object/apply:os.system ['touch {marker}']\ndescription:", 1))
    with pytest.raises(SpecError) as e:
        load_spec(tagged)
    assert str(tagged) in str(e.value)
    dotted = tmp_path / "dotted.yaml"
    dotted.write_text(base.replace("consume_restart", "os.system", 1))
    with pytest.raises(SpecError, match=r"'os\.system' is not a valid name"):
        load_spec(dotted)
    named = tmp_path / "named.yaml"  # a valid name that is no registered action
    named.write_text(base.replace("consume_restart", "system", 1))
    with pytest.raises(SpecError, match="unknown action 'system'"):
        load_spec(named)
    assert not marker.exists()


def test_trace_files_are_json_data_only(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    trace = tmp_path / "t.jsonl"
    header = {"kind": "header", "format": "fsm-agent-trace", "version": 1,
              "spec": f"__import__('os').system('touch {marker}')"}
    trace.write_text(json.dumps(header) + "\n" + "!!python/object/apply:os.system ['x']\n")
    with pytest.raises(TraceError, match=":2: not valid JSON"):
        read_trace(trace)
    assert not marker.exists()


def _spec_naming(tmp_path: Path, how: str, marker: Path) -> Path:
    """The resilient preset, changed as a spec someone hands you might be: it names a command
    (or a host to probe) itself, as a literal or as a parameter's default."""
    base = (Path(__file__).parents[2] / "specs" / "resilient.yaml").read_text()
    command = f'"touch {marker}"'
    if how == "literal command":
        text = base.replace("command: health_command,", f"command: {command},", 1)
    elif how == "default command":
        text = base.replace('health_command:\n    type: str\n    default: ""',
                            f"health_command:\n    type: str\n    default: {command}", 1)
    else:  # a host and port of the spec's choosing
        text = base.replace("store_reachable: 10s",
                            "store_reachable: {timeout: 10s, endpoint: '10.0.0.1:22'}", 1)
    assert text != base
    path = tmp_path / "handed.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("how", ["literal command", "default command", "literal endpoint"])
def test_a_spec_alone_never_runs_a_command_or_probes_a_host(tmp_path: Path, how: str) -> None:
    import subprocess
    import sys

    marker = tmp_path / "pwned"
    spec = _spec_naming(tmp_path, how, marker)
    lines = spec.read_text().splitlines()
    line = next(i for i, x in enumerate(lines, 1) if "pwned" in x or "10.0.0.1" in x)
    cli = [sys.executable, "-m", "fsm_agent"]
    runs = {
        "check": ([*cli, "check", str(spec)], 1),
        "run": ([*cli, "run", "--standalone", "--nproc-per-node", "1", "--spec", str(spec),
                 "--no-python", "true"], 2),
        "demo": ([*cli, "demo", "--spec", str(spec)], 2),
        "conformance": ([*cli, "conformance", "tests.conformance.test_resilient:MixinResilient",
                         "--spec", str(spec), "--examples", "1"], 2),
    }
    for name, (argv, rc) in runs.items():
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                             cwd=Path(__file__).parents[2])
        assert res.returncode == rc, (name, res.stdout, res.stderr)
        # one line, naming the file and the line that sets it, and how to give it instead
        assert f"{spec}:{line}:" in res.stderr and "--spec-param" in res.stderr, (name, res.stderr)
        assert "Traceback" not in res.stderr
    assert not marker.exists()


def test_the_user_gives_the_health_command_with_spec_param(tmp_path: Path) -> None:
    import subprocess
    import sys

    marker = tmp_path / "ran"
    res = subprocess.run([sys.executable, "-m", "fsm_agent", "run", "--standalone",
                          "--nproc-per-node", "1", "--spec", "resilient", "--spec-param",
                          f"health_command=touch {marker}", "--no-python", "true"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert marker.exists()  # the user's own command ran, before the first rendezvous


def test_the_report_opens_no_file_a_trace_names_outside_the_log_dirs_given(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-LINE\n")
    logs = tmp_path / "logs"
    (logs / "stacks").mkdir(parents=True)
    good = logs / "stacks" / "rank_0.txt"
    good.write_text("Thread 42 (idle): MainThread\n    deadlocked_here (train.py:7)\n\x1b[31m\n")
    (logs / "stacks" / "link.txt").symlink_to(secret)
    fifo = logs / "stacks" / "fifo.txt"
    os.mkfifo(fifo)
    named = [secret, Path("/dev/zero"), fifo, logs / "stacks" / "link.txt",
             logs / "stacks" / ".." / ".." / "secret.txt", good]
    data = Path(__file__).parents[1] / "tools" / "data" / "fail_once_recover.jsonl"
    records = [json.loads(x) for x in data.read_text().splitlines()]
    step = next(r for r in records if r.get("observed") == "FAILED")
    step["diagnostics"] = {"stacks": [{"rank": i, "pid": 100 + i, "path": str(p),
                                       "method": "py-spy"} for i, p in enumerate(named)]}
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in records))
    fsm = [sys.executable, "-m", "fsm_agent", "report", str(trace)]
    # without --log-dir: every stack file is named, none is read
    res = subprocess.run([*fsm, "-o", str(tmp_path / "plain.html")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "plain.html").read_text()
    assert "TOP-SECRET" not in page and "deadlocked_here" not in page
    assert str(good) in page and "--log-dir" in page
    # with it: only the regular file under it, its control characters escaped; no hang on the
    # FIFO, no endless read of /dev/zero, neither the link nor .. leads out
    res = subprocess.run([*fsm, "--log-dir", str(logs), "-o", str(tmp_path / "logs.html")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "logs.html").read_text()
    assert "deadlocked_here" in page and "TOP-SECRET" not in page and "\x1b" not in page
    assert page.count("not read: outside") == 4 and "a FIFO" in page, page
    res = subprocess.run([*fsm, "--log-dir", str(secret)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--log-dir" in res.stderr
