"""torch's launcher test classes, run as upstream's classes run: one scenario after another in one
interpreter, with ``fsm_agent.cli.main(["run", ...])`` for torchrun's ``main`` (``run``: torch's
``test/distributed/launcher/test_run.py``) or ``fsm_agent.torch.launch`` for ``launch_agent`` /
``elastic_launch`` (``api``: ``api_test.py`` and ``test_api.py``).

``python launcher_scenarios.py run|api WORKDIR`` writes one JSON line per scenario to
``WORKDIR/results.jsonl``, named by the
upstream test it mirrors, with what it observed (exit codes, files touched, errors raised, how
often a method was called); the tests in ``test_launcher_run.py`` and ``test_launcher_api.py``
hold upstream's assertions over them. The worker scripts are written again from upstream's
``bin/`` (what they check, not their text).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import multiprocessing as mp
import os
import runpy
import signal
import stat
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

# bin/test_script.py: every variable the agent must set (a KeyError otherwise), then --fail
# raises or a file named by the global rank is touched.
TEST_SCRIPT = r"""
import argparse, os
from pathlib import Path
p = argparse.ArgumentParser()
p.add_argument("--fail", action="store_true")
p.add_argument("--touch-file-dir", "--touch_file_dir")
a = p.parse_args()
for v in ("LOCAL_RANK RANK GROUP_RANK ROLE_RANK ROLE_NAME LOCAL_WORLD_SIZE WORLD_SIZE "
          "ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT "
          "TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID OMP_NUM_THREADS TEST_SENTINEL_PARENT "
          "TORCHELASTIC_ERROR_FILE").split():
    print(v, "=", os.environ[v])
if a.fail:
    raise RuntimeError("raising exception since --fail flag was set")
Path(a.touch_file_dir, os.environ["RANK"]).touch()
"""
# bin/test_script.sh
TEST_SCRIPT_SH = """#!/bin/bash
FILE="$1/$RANK"
echo "creating $FILE"
touch "$FILE"
"""
# bin/test_script_is_torchelastic_launched.py
IS_LAUNCHED = r"""
import argparse
import torch.distributed as dist
p = argparse.ArgumentParser()
p.add_argument("--out-file", "--out_file", required=True)
with open(p.parse_args().out_file, "w") as f:
    f.write(str(dist.is_torchelastic_launched()))
"""
# bin/test_script_init_method.py: a gloo group by --init-method; an all_reduce of one-hot
# tensors must add up to the world size.
INIT_METHOD = r"""
import argparse, os
import torch, torch.distributed as dist
p = argparse.ArgumentParser()
p.add_argument("--init-method", "--init_method", required=True)
a = p.parse_args()
dist.init_process_group("gloo", init_method=a.init_method,
                        world_size=int(os.environ["WORLD_SIZE"]), rank=int(os.environ["RANK"]))
t = torch.nn.functional.one_hot(torch.tensor(dist.get_rank()), dist.get_world_size())
dist.all_reduce(t)
assert int(t.sum()) == dist.get_world_size(), t
dist.destroy_process_group()
"""

Scenario = Callable[[Path], dict[str, Any]]
SCENARIOS: dict[str, list[tuple[str, Scenario]]] = {"run": [], "api": []}
BIN: dict[str, str] = {}


def scenario(group: str, *names: str) -> Callable[[Scenario], Scenario]:
    """Register ``fn`` as the scenario of each upstream test in ``names`` (same body upstream)."""
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[group].extend((name, fn) for name in names)
        return fn
    return register


def write_bin(where: Path) -> None:
    where.mkdir()
    for name, text in (("test_script.py", TEST_SCRIPT), ("test_script.sh", TEST_SCRIPT_SH),
                       ("is_launched.py", IS_LAUNCHED), ("init_method.py", INIT_METHOD)):
        (where / name).write_text(text)
        BIN[name] = str(where / name)
    os.chmod(BIN["test_script.sh"], os.stat(BIN["test_script.sh"]).st_mode | stat.S_IXUSR)


def free_port() -> int:
    from fsm_test_procs import free_port as port

    return port()


def ranks(d: Path) -> list[str]:
    return sorted((p.name for p in d.iterdir() if p.name.isdigit()), key=int)


def cli(args: list[str]) -> tuple[int, str]:
    """``fsm-agent run ARGS`` in this process: the exit code and what it wrote to stderr."""
    from fsm_agent.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["run", *args])
    return rc, err.getvalue()


@contextlib.contextmanager
def counting(target: str, **kw: Any) -> Iterator[mock.MagicMock]:
    """``mock.patch`` of the method ``module.Class.method``, which still runs unless
    ``side_effect`` is given: how often it was called."""
    module, cls, attr = target.rsplit(".", 2)
    kw.setdefault("side_effect", getattr(getattr(importlib.import_module(module), cls), attr))
    with mock.patch(target, autospec=True, **kw) as m:
        yield m


SHUTDOWN = ("torch.distributed.elastic.rendezvous.dynamic_rendezvous."
            "DynamicRendezvousHandler.shutdown")
STATIC_SHUTDOWN = ("torch.distributed.elastic.rendezvous.static_tcp_rendezvous."
                   "StaticTCPRendezvous.shutdown")
RECORD = "torch.distributed.elastic.events.record"
AGENT_RUN = "fsm_agent.torch._agent.FSMElasticAgent.run"


class MockException(Exception):
    pass


def sources(record: mock.MagicMock) -> list[str]:
    """The source of each event recorded through the patched ``events.record``."""
    return [c.args[0].source.value for c in record.call_args_list]


# -- test_run.py's ElasticLaunchTest on fsm_agent.cli.main ------------------------------------
# Upstream's arguments, 2 workers a node where upstream has 4 (half the processes on 2 cores).

# Where upstream leaves --run-path's function workers to the default start method (spawn: each
# worker imports torch again, seconds on 2 cores), they are forked.
FORK = "--start-method=fork"


def _common(nproc: int | str | None = 2) -> list[str]:
    args = ["--nnodes=1", f"--rdzv-id={uuid.uuid4().int}", "--monitor-interval=1",
            "--start-method=spawn"]
    return args if nproc is None else [f"--nproc-per-node={nproc}", *args]


@scenario("run", "test_launch_user_script_python")
def user_script_python(d: Path) -> dict[str, Any]:
    rc, err = cli([*_common(), BIN["test_script.py"], f"--touch-file-dir={d}"])
    return {"rc": rc, "ranks": ranks(d), "world": 2, "err": err}


@scenario("run", "test_launch_user_script_python_caffe2_bc")
def caffe2_bc(d: Path) -> dict[str, Any]:
    rc, err = cli(["--nnodes=1", "--nproc-per-node=2", "--monitor-interval=1",
                   "--start-method=spawn", "--master-addr=localhost",
                   f"--master-port={free_port()}", "--node-rank=0", BIN["test_script.py"],
                   f"--touch-file-dir={d}"])
    return {"rc": rc, "ranks": ranks(d), "world": 2, "err": err}


def _bash(d: Path, nproc: int | str | None) -> dict[str, Any]:
    args = [*_common(nproc), "--no-python"]
    # upstream: ValueError (--no-python cannot be used with --module)
    conflict = cli([*args, "--module", BIN["test_script.sh"], str(d)])
    rc, err = cli([*args, BIN["test_script.sh"], str(d)])
    return {"conflict": conflict, "rc": rc, "ranks": ranks(d), "err": err}


@scenario("run", "test_launch_user_script_bash")
def user_script_bash(d: Path) -> dict[str, Any]:
    return {**_bash(d, 2), "world": 2}


@scenario("run", "test_launch_user_script_default_nproc")
def default_nproc(d: Path) -> dict[str, Any]:
    return {**_bash(d, None), "world": 1}


@scenario("run", "test_launch_with_env_vars")
def with_env_vars(d: Path) -> dict[str, Any]:
    env = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "2", "PET_RDZV_ID": str(uuid.uuid4().int),
           "PET_MONITOR_INTERVAL": "1", "PET_START_METHOD": "spawn", "PET_NO_PYTHON": "1"}
    with mock.patch.dict(os.environ, env):
        os.environ["PET_MODULE"] = "1"
        conflict = cli([BIN["test_script.sh"], str(d)])
        os.environ["PET_MODULE"] = "0"
        rc, err = cli([BIN["test_script.sh"], str(d)])
    return {"conflict": conflict, "rc": rc, "ranks": ranks(d), "world": 2, "err": err}


def _nproc(d: Path, nproc: str) -> dict[str, Any]:
    for f in d.iterdir():
        f.unlink()
    rc, err = cli([*_common(nproc), "--no-python", BIN["test_script.sh"], str(d)])
    return {"rc": rc, "ranks": ranks(d), "err": err}


@scenario("run", "test_nproc_launch_auto_configurations")
def nproc_auto(d: Path) -> dict[str, Any]:
    import torch

    with mock.patch("torch.accelerator.is_available", return_value=False):
        return {**_nproc(d, "auto"), "world": torch._utils.cpu_count()}


@scenario("run", "test_nproc_launch_number_configurations")
def nproc_number(d: Path) -> dict[str, Any]:
    return {**_nproc(d, "4"), "world": 4}


@scenario("run", "test_nproc_launch_unknown_configurations")
def nproc_unknown(d: Path) -> dict[str, Any]:
    return _nproc(d, "unknown")


def _accelerator(d: Path, kind: str) -> dict[str, Any]:
    with mock.patch(f"torch.{kind}.is_available", return_value=True), \
            mock.patch(f"torch.{kind}.device_count", return_value=3), \
            mock.patch("torch.accelerator.is_available", return_value=True), \
            mock.patch("torch.accelerator.device_count", return_value=3), \
            mock.patch("torch.accelerator.current_accelerator",
                       return_value=mock.MagicMock(type="gpu" if kind == "cuda" else kind)):
        return {"auto": _nproc(d, "auto"), "named": _nproc(d, "gpu" if kind == "cuda" else kind),
                "world": 3}


@scenario("run", "test_nproc_gpu_launch_configurations")
def nproc_gpu(d: Path) -> dict[str, Any]:
    return _accelerator(d, "cuda")


@scenario("run", "test_nproc_xpu_launch_configurations")
def nproc_xpu(d: Path) -> dict[str, Any]:
    return _accelerator(d, "xpu")


def _elastic(*extra: str, conf: str = "'join_timeout=5,last_call_timeout=1,timeout=5'"
             ) -> list[str]:
    return ["--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=localhost:{free_port()}", f"--rdzv-conf={conf}",
            f"--rdzv-id={uuid.uuid4().int}", "--monitor-interval=1", *extra,
            "--start-method=spawn"]


@scenario("run", "test_launch_elastic")
def launch_elastic(d: Path) -> dict[str, Any]:
    rc, err = cli([*_elastic(), BIN["test_script.py"], f"--touch-file-dir={d}"])
    return {"rc": rc, "ranks": ranks(d), "world": 2, "err": err}


@scenario("run", "test_launch_elastic_worker_raise_exception")
def elastic_worker_raise(d: Path) -> dict[str, Any]:
    with mock.patch(RECORD) as record:
        rc, err = cli([*_elastic("--max-restarts=0"), BIN["test_script.py"], "--fail"])
    return {"rc": rc, "sources": sources(record), "err": err}


@scenario("run", "test_launch_elastic_agent_raise_exception")
def elastic_agent_raise(d: Path) -> dict[str, Any]:
    with mock.patch(RECORD) as record, mock.patch(AGENT_RUN, side_effect=MockException):
        rc, err = cli([*_elastic("--max-restarts=0", conf="timeout=5"), BIN["test_script.py"],
                       f"--touch-file-dir={d}"])
    return {"rc": rc, "sources": sources(record), "err": err}


@scenario("run", "test_launch_run_path")
def run_path(d: Path) -> dict[str, Any]:
    rc, err = cli(["--run-path", "--nnodes=1", "--nproc-per-node=2", "--monitor-interval=1",
                   "--start-method=spawn", BIN["test_script.py"], f"--touch-file-dir={d}"])
    return {"rc": rc, "ranks": ranks(d), "world": 2, "err": err}


@scenario("run", "test_min_max_nodes_parse")
def min_max_nodes(d: Path) -> dict[str, Any]:
    from torch.distributed.run import parse_min_max_nnodes

    # fsm-agent run parses --nnodes with torch's own function (config_from_args); what it adds
    # is the refusal before anything starts
    return {"one": parse_min_max_nnodes("1"), "range": parse_min_max_nnodes("2:20"),
            "three": cli(["--nnodes=2:20:30", BIN["test_script.py"]])}


@scenario("run", "test_launch_shutdown")
def launch_shutdown(d: Path) -> dict[str, Any]:
    with counting(SHUTDOWN) as shutdown:
        rc, err = cli(["--nnodes=1", "--nproc-per-node=2", "--monitor-interval=1",
                       "--start-method=spawn", BIN["test_script.py"], f"--touch-file-dir={d}"])
    return {"rc": rc, "shutdowns": shutdown.call_count, "err": err}


def _is_launched(d: Path, *extra: str) -> dict[str, Any]:
    out = d / "out"
    out.unlink(missing_ok=True)
    rc, err = cli(["--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1",
                   *extra, FORK, BIN["is_launched.py"], f"--out-file={out}"])
    return {"rc": rc, "out": out.read_text() if out.exists() else None, "err": err}


@scenario("run", "test_is_torchelastic_launched")
def is_launched(d: Path) -> dict[str, Any]:
    return _is_launched(d)


@scenario("run", "test_is_torchelastic_launched_with_logs_spec_defined")
def is_launched_logs_spec(d: Path) -> dict[str, Any]:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    # upstream's mock of the entry-point lookup, in torch's run module (which fsm-agent calls)
    with mock.patch("torch.distributed.run.metadata") as metadata:
        group = metadata.entry_points.return_value.select.return_value
        ep = mock.MagicMock()
        ep.load.return_value = DefaultLogsSpecs
        group.select.return_value = ep
        group.__getitem__.return_value = ep
        return _is_launched(d, "--logs_specs=default")


@scenario("run", "test_logs_logs_spec_entrypoint_must_be_defined")
def logs_spec_undefined(d: Path) -> dict[str, Any]:
    rc, err = cli(["--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1",
                   "--logs_specs=DOESNOT_EXIST", BIN["is_launched.py"]])
    return {"rc": rc, "err": err}


@scenario("run", "test_is_not_torchelastic_launched")
def is_not_launched(d: Path) -> dict[str, Any]:
    out = d / "out"
    with mock.patch.object(sys, "argv", [BIN["is_launched.py"], f"--out-file={out}"]):
        runpy.run_path(sys.argv[0], run_name="__main__")
    return {"out": out.read_text()}


def _init_method(method: str, port: int) -> dict[str, Any]:
    rc, err = cli(["--run-path", "--nnodes=1", "--nproc-per-node=2", "--master-addr=localhost",
                   f"--master-port={port}", "--monitor-interval=1", FORK, BIN["init_method.py"],
                   f"--init-method={method}"])
    return {"rc": rc, "err": err}


@scenario("run", "test_init_method_tcp_with_torchelastic")
def init_tcp(d: Path) -> dict[str, Any]:
    port = free_port()
    return _init_method(f"tcp://localhost:{port}", port)


@scenario("run", "test_init_method_env_with_torchelastic")
def init_env(d: Path) -> dict[str, Any]:
    return _init_method("env://", free_port())


@scenario("run", "test_capture_logs_using_default_logs_specs")
def capture_logs(d: Path) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), mock.patch.dict(
            os.environ, {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "}):
        rc, err = cli([*_common(), "--redirect=3", "--tee=3", "--no-python",
                       BIN["test_script.sh"], str(d)])
    return {"rc": rc, "out": out.getvalue(), "nproc": 2, "err": err}


# -- api_test.py's ElasticLaunchTest and test_api.py's LauncherApiTest on fsm_agent.torch.launch

# Function workers are forked where upstream spawns them (each would import torch again).
def config(min_nodes: int, max_nodes: int, nproc: int, backend: str = "c10d",
           endpoint: str | None = None, start_method: str = "spawn", **kw: Any) -> Any:
    """upstream's ``get_test_launch_config``, on c10d (upstream: an etcd server of the test's),
    with test_run.py's ``last_call_timeout=1`` (a 1:2 job waits that long for a second node)."""
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(min_nodes=min_nodes, max_nodes=max_nodes, nproc_per_node=nproc,
                        run_id=kw.pop("run_id", str(uuid.uuid4().int)),
                        rdzv_endpoint=endpoint or f"localhost:{free_port()}",
                        monitor_interval=0.1, rdzv_backend=backend, start_method=start_method,
                        max_restarts=0,
                        rdzv_configs=kw.pop("rdzv_configs", {"last_call_timeout": 1}), **kw)


def launch(cfg: Any, entrypoint: Any, *args: Any) -> Any:
    from fsm_agent.torch import launch as fsm_launch

    return fsm_launch(cfg, entrypoint, list(args))


def raised(fn: Callable[[], Any]) -> tuple[str | None, str | None]:
    """What ``fn()`` raised: its type's name and its ``name`` (a ChildFailedError's entrypoint),
    or ``(None, None)``. Not the exception itself: kept, its traceback would hold the agent (and
    its stores) in a cycle, for a collection in the process a later scenario forks."""
    try:
        fn()
    except Exception as e:
        return type(e).__name__, getattr(e, "name", None)
    return None, None


def _script(d: Path, cfg: Any) -> dict[str, Any]:
    launch(cfg, sys.executable, "-u", BIN["test_script.py"], f"--touch-file-dir={d}")
    return {"ranks": ranks(d), "world": cfg.nproc_per_node}


@scenario("api", "test_launch_script_python", "test_launch_script_python_local_rank_transfer")
def api_script_python(d: Path) -> dict[str, Any]:
    return _script(d, config(1, 1, 4))


@scenario("api", "test_launch_script_bash")
def api_script_bash(d: Path) -> dict[str, Any]:
    launch(config(1, 1, 4), BIN["test_script.sh"], str(d))
    return {"ranks": ranks(d), "world": 4}


@scenario("api", "test_launch_function")
def api_function(d: Path) -> dict[str, Any]:
    import upstream_workers

    res = launch(config(1, 1, 4, start_method="fork"), upstream_workers.simple_rank_scale)
    return {"values": sorted(res.values())}


@scenario("api", "test_launch_dist_sum_with_static_rdzv")
def api_dist_sum_static(d: Path) -> dict[str, Any]:
    import upstream_workers

    cfg = config(1, 1, 4, backend="static", endpoint=f"127.0.0.1:{free_port()}",
                 start_method="fork", rdzv_configs={"rank": 0})
    return {"values": sorted(launch(cfg, upstream_workers.launcher_dist_sum).values())}


@scenario("api", "test_launch_elastic")
def api_elastic(d: Path) -> dict[str, Any]:
    return _script(d, config(1, 2, 4))


@scenario("api", "test_launch_elastic_worker_raise_exception")
def api_worker_raise(d: Path) -> dict[str, Any]:
    with mock.patch(RECORD) as record:
        error, _ = raised(lambda: launch(config(1, 2, 4), sys.executable, "-u",
                                         BIN["test_script.py"], "--fail"))
    return {"error": error, "sources": sources(record)}


@scenario("api", "test_launch_elastic_agent_raise_exception")
def api_agent_raise(d: Path) -> dict[str, Any]:
    with mock.patch(RECORD) as record, mock.patch(AGENT_RUN, side_effect=MockException):
        error, _ = raised(lambda: launch(config(1, 2, 4), sys.executable, "-u",
                                         BIN["test_script.py"], f"--touch-file-dir={d}"))
    return {"error": error, "records": record.call_count}


def _launch_wrapper(d: Path, endpoint: str, run_id: str) -> None:
    launch(config(1, 2, 4, endpoint=endpoint, run_id=run_id), sys.executable, "-u",
           BIN["test_script.py"], f"--touch-file-dir={d}")


@scenario("api", "test_launch_elastic_multiple_agents")
def api_multiple_agents(d: Path) -> dict[str, Any]:
    endpoint, run_id = f"localhost:{free_port()}", str(uuid.uuid4().int)
    p = mp.get_context("fork").Process(target=_launch_wrapper, args=(d, endpoint, run_id))
    p.start()
    _launch_wrapper(d, endpoint, run_id)
    p.join(60)
    if p.exitcode is None:
        p.kill()
    return {"exitcode": p.exitcode, "ranks": ranks(d), "world": 8}


@scenario("api", "test_launch_shutdown")
def api_shutdown(d: Path) -> dict[str, Any]:
    with counting(SHUTDOWN) as shutdown:
        _script(d, config(1, 1, 4))
    return {"shutdowns": shutdown.call_count}


@scenario("api", "test_get_entrypoint_name")
def api_entrypoint_name(d: Path) -> dict[str, Any]:
    import upstream_workers

    # the name launch gives the ChildFailedError (torch's _get_entrypoint_name)
    _, script = raised(lambda: launch(config(1, 1, 1), sys.executable, "-u",
                                      BIN["test_script.py"], "--fail"))
    _, function = raised(lambda: launch(config(1, 1, 1, start_method="fork"),
                                        upstream_workers.sad_function))
    return {"script": script, "given": BIN["test_script.py"], "function": function}


@scenario("api", "test_rdzv_handler_shutdown_on_agent_error")
def api_shutdown_on_error(d: Path) -> dict[str, Any]:
    import upstream_workers

    with mock.patch(RECORD) as record, counting(SHUTDOWN) as shutdown, \
            mock.patch(AGENT_RUN, side_effect=RuntimeError("any other exception")):
        error, _ = raised(lambda: launch(config(1, 1, 1), upstream_workers.simple_rank_scale))
    return {"error": error, "shutdowns": shutdown.call_count, "records": record.call_count}


def _signals(d: Path, given: str | None) -> dict[str, Any]:
    os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
    kw = {} if given is None else {"signals_to_handle": given}
    launch(config(1, 1, 1, **kw), sys.executable, "-c", "pass")
    return {"env": os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")}


@scenario("api", "test_launch_agent_sets_signals_env_var")
def api_signals_given(d: Path) -> dict[str, Any]:
    return _signals(d, "SIGTERM,SIGUSR1,SIGUSR2")


@scenario("api", "test_launch_agent_default_signals")
def api_signals_default(d: Path) -> dict[str, Any]:
    return _signals(d, None)


@scenario("api", "test_launch_agent_failing_rdzv_shutdown_does_not_mask_child_failed_error")
def api_failing_shutdown(d: Path) -> dict[str, Any]:
    with counting(SHUTDOWN, side_effect=RuntimeError("Rendezvous store unreachable")) as shutdown:
        error, _ = raised(lambda: launch(config(1, 1, 1), sys.executable, "-c",
                                         "raise SystemExit(3)"))
    return {"error": error, "shutdowns": shutdown.call_count}


# Last: the handler of a signalled agent is not shut down, so its store is left for the end.
@scenario("api", "test_rdzv_handler_shutdown_on_agent_signal")
def api_shutdown_on_signal(d: Path) -> dict[str, Any]:
    import upstream_workers
    from torch.distributed.elastic.multiprocessing.api import SignalException

    seen = []
    for sigval in (signal.SIGTERM, signal.SIGINT):
        with mock.patch(RECORD) as record, counting(SHUTDOWN) as shutdown, \
                mock.patch(AGENT_RUN, side_effect=SignalException("test", sigval)):
            error, _ = raised(lambda: launch(config(1, 1, 1), upstream_workers.simple_rank_scale))
        seen.append({"error": error, "shutdowns": shutdown.call_count,
                     "records": record.call_count})
    return {"signals": seen}


def main(group: str, workdir: Path, only: list[str]) -> None:
    write_bin(workdir / "bin")
    for name, fn in SCENARIOS[group]:
        if only and name not in only:
            continue
        # upstream's setUp: no PET_ variable left, a sentinel the workers check
        for var in [v for v in os.environ if v.startswith("PET_")]:
            del os.environ[var]
        os.environ["TEST_SENTINEL_PARENT"] = "FOOBAR"
        if group == "api":
            os.environ["OMP_NUM_THREADS"] = "1"  # api_test.py's setUp (torchrun sets it itself)
        d = workdir / name
        d.mkdir()
        start = time.monotonic()
        try:
            record = {"test": name, **fn(d)}
        except BaseException as e:  # reported; the other scenarios go on
            record = {"test": name, "raised": repr(e), "tb": traceback.format_exc()}
        record["seconds"] = round(time.monotonic() - start, 2)
        with open(workdir / "results.jsonl", "a") as f:  # the workers share stdout
            f.write(json.dumps(record, default=repr) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:])
