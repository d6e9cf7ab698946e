"""torch's launcher tests (``test/distributed/launcher/test_run.py``) on ``fsm_agent.cli.main``.

Upstream calls torchrun's ``main`` in the test process, one test after another, and forks agent
processes from that same process (``test_launch_elastic_multiple_agents``). The scenarios here
are written again, with upstream's arguments (underscore and dash spellings, ``--rdzv_conf
timeout=5`` on c10d) and assertions (every rank's worker ran, every agent exits 0), in the order
upstream's class runs them, in one fresh interpreter: a standalone run in-process, then two agents
of one job, one in-process and one forked after it. The first run's agent and stores
once outlived it until a garbage collection, which may run in the fork (SIGABRT or a hang, one
run in two upstream); with the collector off the stores' ports are seen still open.
The rest of that class runs below, in one more interpreter (``launcher_scenarios.py run``);
docs/runner.md lists every upstream test and where it is mirrored or why not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from upstream_helpers import run_scenarios

# a worker as upstream's bin/test_script.py uses it: touch a file named by its global rank
_WORKER = r"""
import argparse, os
p = argparse.ArgumentParser()
p.add_argument("--touch-file-dir", "--touch_file_dir", required=True)
open(os.path.join(p.parse_args().touch_file_dir, os.environ["RANK"]), "w").close()
"""

_SCENARIOS = r"""
import gc, multiprocessing as mp, os, sys, uuid
from fsm_agent.cli import main
from upstream_helpers import free_port, listening_ports

script, standalone_dir, multi_dir = sys.argv[1:4]
# Off, so that what a run leaves for a collection is still there when the agent is forked; the
# fork then holds it in a process where the store's server thread does not exist.
gc.disable()
before = listening_ports()


def launch_main(args):
    gc.collect()  # what the forked agent's first collection meets: the parent's leftovers
    sys.exit(main(["run", *args]))


# test_launch_standalone
rc = main(["run", "--nnodes=1", "--nproc_per_node=2", "--standalone", "--monitor_interval=1",
           "--start_method=spawn", script, f"--touch-file-dir={standalone_dir}"])
print("standalone", rc, sorted(os.listdir(standalone_dir)),
      "open", sorted(listening_ports() - before), flush=True)

# test_launch_elastic_multiple_agents
args = ["--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=localhost:{free_port()}", "--rdzv_conf=timeout=5",
        f"--rdzv-id={uuid.uuid4().int}", "--monitor-interval=1", "--start-method=spawn", script,
        f"--touch-file-dir={multi_dir}"]
p = mp.get_context("fork").Process(target=launch_main, args=[args])
p.start()
rc = main(["run", *args])
p.join(60)
if p.exitcode is None:
    p.kill()
print("multiple", rc, p.exitcode, sorted(os.listdir(multi_dir)), flush=True)
"""


@pytest.mark.timeout(150)
def test_standalone_then_multiple_agents_forked_after_an_in_process_run(tmp_path: Path) -> None:
    script = tmp_path / "test_script.py"
    script.write_text(_WORKER)
    dirs = [tmp_path / "standalone", tmp_path / "multiple"]
    for d in dirs:
        d.mkdir()
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", _SCENARIOS, str(script), *map(str, dirs)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        raise AssertionError(f"hung: {out!r}") from None
    finally:
        if proc.poll() is None:  # pragma: no cover - killed above
            os.killpg(proc.pid, 9)
    assert proc.returncode == 0, err[-3000:]
    # upstream: both agents exit 0, and every rank of the world touched its file
    # and the in-process run left no store listening for the fork to inherit
    assert "standalone 0 ['0', '1'] open []" in out, (out, err[-3000:])
    assert "multiple 0 0 ['0', '1', '2', '3']" in out, (out, err[-3000:])


# -- the rest of test_run.py's ElasticLaunchTest: one interpreter, one test per upstream test --
# Upstream's assertRaises(ValueError) on torchrun's main is exit code 2 and one line naming the
# flag on fsm-agent run (docs/cli.md); its assertRaises(ChildFailedError) is exit code 1.


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return run_scenarios("run", tmp_path_factory.mktemp("launcher_run"))


def _result(ran: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    r = ran.get(name)
    assert r is not None, f"{name} did not run"
    assert "raised" not in r, r.get("tb")
    return r


def _all_ranks_ran(r: dict[str, Any]) -> None:
    # upstream: each worker touches a file with its global rank as the name
    assert r["rc"] == 0, r["err"][-3000:]
    assert r["ranks"] == [str(i) for i in range(r["world"])], r


def _usage_error(rc_err: list[Any], *words: str) -> None:
    rc, err = rc_err
    assert rc == 2, err
    assert all(w in err for w in words), err


@pytest.mark.timeout(200)
@pytest.mark.parametrize("name", ["test_launch_user_script_python",
                                  "test_launch_user_script_python_caffe2_bc",
                                  "test_launch_elastic", "test_launch_run_path",
                                  "test_nproc_launch_number_configurations",
                                  "test_nproc_launch_auto_configurations"])
def test_every_rank_ran(ran: dict[str, dict[str, Any]], name: str) -> None:
    _all_ranks_ran(_result(ran, name))


@pytest.mark.parametrize("name", ["test_launch_user_script_bash",
                                  "test_launch_user_script_default_nproc",
                                  "test_launch_with_env_vars"])
def test_no_python_with_module_is_refused_then_the_script_runs(
        ran: dict[str, dict[str, Any]], name: str) -> None:
    r = _result(ran, name)
    _usage_error(r["conflict"], "--no-python", "--module")
    _all_ranks_ran(r)


def test_nproc_launch_unknown_configurations(ran: dict[str, dict[str, Any]]) -> None:
    r = _result(ran, "test_nproc_launch_unknown_configurations")
    _usage_error([r["rc"], r["err"]], "--nproc-per-node", "'unknown'")
    assert r["ranks"] == []


@pytest.mark.parametrize("name", ["test_nproc_gpu_launch_configurations",
                                  "test_nproc_xpu_launch_configurations"])
def test_nproc_accelerator_launch_configurations(ran: dict[str, dict[str, Any]],
                                                 name: str) -> None:
    r = _result(ran, name)
    for run in (r["auto"], r["named"]):
        _all_ranks_ran({**run, "world": r["world"]})


def test_launch_elastic_worker_raise_exception(ran: dict[str, dict[str, Any]]) -> None:
    r = _result(ran, "test_launch_elastic_worker_raise_exception")
    assert r["rc"] == 1, r["err"][-3000:]
    assert "test_script.py FAILED" in r["err"] and "Root Cause" in r["err"], r["err"]
    # upstream: record_mock.assert_called_once(), the launcher's event; torch's agent records
    # its workers' START events through a name bound at import, which the patch does not
    # replace, fsm_agent's through the patched one
    assert r["sources"].count("AGENT") == 1, r["sources"]
    assert set(r["sources"]) == {"AGENT", "WORKER"}, r["sources"]


def test_launch_elastic_agent_raise_exception(ran: dict[str, dict[str, Any]]) -> None:
    r = _result(ran, "test_launch_elastic_agent_raise_exception")
    # upstream: the agent's exception re-raised; here exit 1 and one line naming it
    assert r["rc"] == 1, r["err"]
    assert "error: MockException" in r["err"], r["err"]
    assert r["sources"] == ["AGENT"], r["sources"]


def test_min_max_nodes_parse(ran: dict[str, dict[str, Any]]) -> None:
    r = _result(ran, "test_min_max_nodes_parse")
    assert r["one"] == [1, 1] and r["range"] == [2, 20], r
    _usage_error(r["three"], "--nnodes", "'2:20:30'")


def test_launch_shutdown(ran: dict[str, dict[str, Any]]) -> None:
    r = _result(ran, "test_launch_shutdown")
    assert r["rc"] == 0, r["err"][-3000:]
    assert r["shutdowns"] == 1, r


@pytest.mark.parametrize("name", ["test_is_torchelastic_launched",
                                  "test_is_torchelastic_launched_with_logs_spec_defined"])
def test_is_torchelastic_launched(ran: dict[str, dict[str, Any]], name: str) -> None:
    r = _result(ran, name)
    assert r["rc"] == 0, r["err"][-3000:]
    assert r["out"] == "True"


def test_logs_logs_spec_entrypoint_must_be_defined(ran: dict[str, dict[str, Any]]) -> None:
    r = _result(ran, "test_logs_logs_spec_entrypoint_must_be_defined")
    _usage_error([r["rc"], r["err"]], "DOESNOT_EXIST")


def test_is_not_torchelastic_launched(ran: dict[str, dict[str, Any]]) -> None:
    assert _result(ran, "test_is_not_torchelastic_launched")["out"] == "False"


@pytest.mark.parametrize("name", ["test_init_method_tcp_with_torchelastic",
                                  "test_init_method_env_with_torchelastic"])
def test_init_method_with_torchelastic(ran: dict[str, dict[str, Any]], name: str) -> None:
    r = _result(ran, name)
    assert r["rc"] == 0, r["err"][-3000:]


def test_capture_logs_using_default_logs_specs(ran: dict[str, dict[str, Any]]) -> None:
    r = _result(ran, "test_capture_logs_using_default_logs_specs")
    assert r["rc"] == 0, r["err"][-3000:]
    for i in range(r["nproc"]):
        assert f"[rank{i}]: creating " in r["out"], r["out"]
