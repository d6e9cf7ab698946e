"""A finished ``FSMElasticAgent`` is freed by reference counting alone.

Found by torch's ``test_torch_rpc_c10d`` and ``test_run_with_custom_log_lines``: the agent, its
driver and its lifecycle referred to each other, so the rendezvous handler's TCPStore servers
(and their threads) stayed alive until a garbage collection. In a process that forks later, the
child that happens to collect them aborts, segfaults or hangs for ever in ``~TCPStore``. With the
collector off, dropping the last reference must free the agent and close the store's port, after
``run()`` returns and after it raises (an exception passes through ``transitions``, which keeps
it in a local of a frame of its own traceback).
"""

from __future__ import annotations

import gc
import signal
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import upstream_workers as w
from torch.distributed.elastic.multiprocessing import SignalException
from upstream_helpers import Procs, endpoint, listening_ports

from fsm_agent import ActionError, WorkerGroupFailureException
from fsm_agent.torch import FSMElasticAgent


class StopFails(FSMElasticAgent):
    def _stop_workers(self, worker_group: Any, *args: Any, **kwargs: Any) -> None:
        super()._stop_workers(worker_group, *args, **kwargs)
        raise RuntimeError("stop failed")


class Signalled(FSMElasticAgent):
    def _monitor_workers(self, worker_group: Any) -> Any:
        super()._monitor_workers(worker_group)
        raise SignalException("Process got signal: 15", signal.SIGTERM)


# Binary workers (torchrun's case). Function workers' failures are logged by torch with the
# exception attached: pytest keeps those log records, tracebacks and all, until the test ends, and
# torch's log formatter imports torch._dynamo on the first one (4 s; during that import
# torch.fx.wrap leaves a frame cycle holding the stack of the moment: once per process, torch's).
HAPPY = "pass"
SAD = "raise SystemExit(1)"
SLEEP = "import time; time.sleep(0.2)"
CASES: dict[str, tuple[str, str, type[FSMElasticAgent], type[BaseException] | None]] = {
    "succeeded": (HAPPY, "torchrun", FSMElasticAgent, None),
    "failed-returned": (SAD, "torchrun", FSMElasticAgent, None),
    "failed-raised": (SAD, "torchelastic", FSMElasticAgent, WorkerGroupFailureException),
    "action-error": (SAD, "torchrun", StopFails, ActionError),
    "signal": (SLEEP, "torchrun", Signalled, SignalException),
}


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(CASES))
def test_finished_agent_is_freed_by_reference_counting(
    procs: Procs, no_gc: None, case: str
) -> None:
    code, preset, cls, raises = CASES[case]
    before = listening_ports()
    conf = procs.conf(sys.executable, 2, args=("-c", code), backend="c10d",
                      endpoint=endpoint(), lifecycle_spec=preset, max_restarts=1)
    spec = w.worker_spec(conf)
    agent = w.make_agent(conf, spec)
    agent.__class__ = cls  # same constructor arguments, one hook changed
    assert listening_ports() > before  # the c10d rendezvous store of this agent
    refs = {"agent": weakref.ref(agent), "handler": weakref.ref(spec.rdzv_handler),
            "driver": weakref.ref(agent.driver)}
    error: BaseException | None = None
    try:
        agent.run()
    except BaseException as e:
        error = e
    if raises is None:
        assert error is None
    else:
        assert isinstance(error, raises), error
    spec.rdzv_handler.shutdown()
    del agent, spec, error
    alive = [name for name, ref in refs.items() if ref() is not None]
    assert not alive, f"still referenced after run() ({case}): {alive}"
    assert listening_ports() <= before


# Run in a fresh interpreter: the CLI configures logging, and the child it forks must start from
# a process where only `main` ran. With the collector off, whatever `main` left behind is still
# there for the child's collection to meet.
_FORK_AFTER_MAIN = r"""
import gc, os, sys, weakref
from fsm_agent.torch import FSMElasticAgent
from fsm_agent.cli import main
from upstream_helpers import listening_ports

gc.collect()
gc.disable()
made = []
init = FSMElasticAgent.__init__
def tracked(self, *a, **kw):
    init(self, *a, **kw)
    made.append(weakref.ref(self))
FSMElasticAgent.__init__ = tracked
before = listening_ports()
rc = main(["run", "--standalone", "--nproc-per-node", "1", "--spec", sys.argv[1],
           "--max-restarts", "0", "--no-python", sys.executable, "-c", sys.argv[2]])
alive = sum(ref() is not None for ref in made)
ports = sorted(listening_ports() - before)
pid = os.fork()
if pid == 0:
    gc.collect()  # ~TCPStore here aborts or hangs when main leaked its agent
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(f"rc={rc} made={len(made)} alive={alive} ports={ports} child={status}", flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("preset", "code", "rc"), [
    ("torchelastic", HAPPY, 0), ("torchrun", SAD, 1), ("resilient", SAD, 1)])
def test_in_process_cli_run_leaves_nothing_for_a_forked_child(preset: str, code: str,
                                                              rc: int) -> None:
    """``fsm_agent.cli.main(["run", ...])`` called in-process once held its agent in a
    cycle (the CLI's reference to it was one of the agent's listeners); a child forked later
    met its TCPStores in its first collection and aborted or hung."""
    import os
    import subprocess
    from pathlib import Path

    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])}
    try:
        res = subprocess.run([sys.executable, "-c", _FORK_AFTER_MAIN, preset, code], env=env,
                             capture_output=True, text=True, timeout=90, start_new_session=True)
    except subprocess.TimeoutExpired as e:  # the child hung in ~TCPStore
        raise AssertionError(f"hung after main returned: {e.stdout!r}") from e
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"rc={rc} made=1 alive=0 ports=[] child=0" in res.stdout, (res.stdout,
                                                                       res.stderr[-2000:])
