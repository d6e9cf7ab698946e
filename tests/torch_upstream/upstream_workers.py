"""Worker functions of torch's ``local_elastic_agent_test.py`` (same names, same behaviour), and
the body of an agent process for the multi-agent scenarios.

Workers are started by torch's ``MultiprocessContext`` with the ``forkserver`` start method; this
module is the forkserver's preload (it imports torch once, not in every worker), so it must stay
importable without pytest. A unique module name: several test directories exist side by side.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

#: What the forkserver imports once for all the processes it forks. Python 3.11's forkserver
#: ignores the parent's sys.path when it preloads, so this module itself may not load there; the
#: installed packages do, and they are the cost (torch: about a second per process otherwise).
#: torch._dynamo too: torch's log formatter imports it (4 s) the first time it formats an
#: exception, which an agent does when a function worker fails.
PRELOAD = ["__main__", "torch", "torch.distributed", "torch.distributed.elastic.multiprocessing",
           "fsm_agent.torch", "torch._dynamo", __name__]

# torch's local_elastic_agent_test: the worker functions -------------------------------------


def happy_function() -> None:
    return


def sad_function() -> None:
    raise RuntimeError("sad because i throw")


def simple_rank_scale() -> int:
    """torch's launcher ``api_test.py``: a value that names the rank."""
    return 10 + int(os.environ["RANK"])


def echo(msg: Any) -> Any:
    return msg


def dummy_compute() -> torch.Tensor:
    return torch.rand(100, 100)


def dummy_compute_simulate_rank_failure() -> torch.Tensor:
    """Rank 1 kills itself (SIGKILL) on the first attempt only."""
    if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    return torch.rand(100, 100)


def bipolar_function() -> None:
    """Even ranks succeed, odd ranks raise."""
    if int(os.environ["RANK"]) % 2 == 0:
        happy_function()
    else:
        sad_function()


def bipolar_sleep_function(sleep_sec: float) -> None:
    """Even ranks sleep, odd ranks raise."""
    if int(os.environ["RANK"]) % 2 == 0:
        sleep(sleep_sec)
    else:
        sad_function()


def dist_sum(wait: float = 0) -> int:
    """A gloo all_reduce of the ranks, checked against the expected sum; returns the rank."""
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend="gloo")
    try:
        t = torch.tensor(rank)
        time.sleep(wait)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        expected = sum(range(world_size))
        if t.item() != expected:
            raise RuntimeError(f"Expected rank sum {expected}, got {t.item()}")
    finally:
        dist.destroy_process_group()
    return rank


def launcher_dist_sum() -> int:
    """torch's launcher ``api_test.py`` ``_dist_sum``: the all_reduced sum of the ranks."""
    dist.init_process_group(backend="gloo")
    try:
        t = torch.tensor(int(os.environ["RANK"]))
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return int(t.item())
    finally:
        dist.destroy_process_group()


def dist_sum_verbose() -> int:
    """``dist_sum``, saying so on stdout first (for the log-line prefix)."""
    print(f"summing on rank {os.environ['RANK']}", flush=True)
    return dist_sum()


def sleep(sleep_sec: float) -> int:
    time.sleep(sleep_sec)
    return int(os.environ["RANK"])


def check_env_function() -> None:
    """Every variable torch's agent promises its workers (os.environ[...] raises if missing)."""
    for var in ENV_VARS:
        _ = os.environ[var]


ENV_VARS = (
    "RANK", "LOCAL_RANK", "ROLE_RANK", "ROLE_NAME", "GROUP_RANK", "LOCAL_WORLD_SIZE",
    "ROLE_WORLD_SIZE", "WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)


def check_env_value(key: str, expected: str) -> None:
    if key not in os.environ:
        raise RuntimeError(f"Environment variable {key} not found in os.environ")
    if os.environ[key] != expected:
        raise RuntimeError(f"os.environ[{key!r}]={os.environ[key]} is not {expected}")


def check_local_watchdog_setup(key: str, should_exist: bool) -> None:
    if should_exist and key not in os.environ:
        raise RuntimeError(f"Environment variable {key} not found in os.environ")
    if not should_exist and key in os.environ:
        raise RuntimeError(f"Environment variable {key} found in os.environ")


def master_addr_port() -> tuple[str, int]:
    return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


@dataclass
class RankInfo:
    rank: int
    role_rank: int
    group_rank: int
    role_world_size: int
    world_size: int


def get_role_info() -> RankInfo:
    e = os.environ
    return RankInfo(int(e["RANK"]), int(e["ROLE_RANK"]), int(e["GROUP_RANK"]),
                    int(e["ROLE_WORLD_SIZE"]), int(e["WORLD_SIZE"]))


# Ours (not upstream): a worker for the membership-change scenario --------------------------


def elastic_sum(nodes: int) -> int:
    """Wait (until restarted) while fewer than ``nodes`` agents are in the group, then sum."""
    if int(os.environ["GROUP_WORLD_SIZE"]) < nodes:
        time.sleep(60)  # stopped by the agent's restart when the other node joins
        raise RuntimeError("the other node never joined")
    return dist_sum()


# An agent in its own process (torch's run_job runs each agent in a multiprocessing.Process) --


@dataclass
class AgentConf:
    """What an agent process needs (torch's ``Conf`` plus the rendezvous)."""

    entrypoint: Any
    local_world_size: int
    args: tuple[Any, ...] = ()
    role: str = "default"
    backend: str = "c10d"
    endpoint: str = ""
    run_id: str = ""
    min_nodes: int = 1
    max_nodes: int = 1
    is_host: bool = True
    max_restarts: int = 0
    monitor_interval: float = 0.01
    exit_barrier_timeout: float = 5
    lifecycle_spec: str = "torchrun"
    log_line_prefix_template: str | None = None
    tee: int = 0  # torch's Std value
    log_dir: str = ""
    rdzv_configs: dict[str, Any] | None = None
    rank: int | None = None  # the static backend's node rank
    output: str = ""  # a file for the agent process' stdout and stderr (and its workers')
    torch_agent: bool = False  # torch's LocalElasticAgent instead (to compare)
    start_method: str = "forkserver"


def worker_spec(conf: AgentConf) -> Any:
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous import registry as rdzv_registry

    extra: dict[str, Any] = dict(conf.rdzv_configs or {})
    if conf.rank is not None:
        extra["rank"] = conf.rank
    params = RendezvousParameters(
        backend=conf.backend, endpoint=conf.endpoint, run_id=conf.run_id or uuid.uuid4().hex,
        min_nodes=conf.min_nodes, max_nodes=conf.max_nodes, is_host=conf.is_host, **extra,
    )
    return WorkerSpec(
        role=conf.role, local_world_size=conf.local_world_size, entrypoint=conf.entrypoint,
        args=conf.args, rdzv_handler=rdzv_registry.get_rendezvous_handler(params),
        max_restarts=conf.max_restarts, monitor_interval=conf.monitor_interval,
    )


def make_agent(conf: AgentConf, spec: Any, **kwargs: Any) -> Any:
    """``FSMElasticAgent`` built as torch's test builds its ``LocalElasticAgent``."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    from fsm_agent.torch import FSMElasticAgent

    common = {
        "logs_specs": DefaultLogsSpecs(log_dir=conf.log_dir or None, tee=Std(conf.tee)),
        "start_method": conf.start_method,
        "exit_barrier_timeout": conf.exit_barrier_timeout,
        "log_line_prefix_template": conf.log_line_prefix_template,
    }
    if conf.torch_agent:
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

        return LocalElasticAgent(spec, **common, **kwargs)
    return FSMElasticAgent(spec, lifecycle_spec=conf.lifecycle_spec, **common, **kwargs)


@dataclass
class AgentOutcome:
    """What an agent process reports: its result (or error) and its restart bookkeeping."""

    result: Any  # RunResult, or "Type: message" if run() raised
    remaining_restarts: int
    restart_count: int  # failure restarts (the lifecycle's count)
    rounds: int  # rendezvous rounds joined (first one included)
    elapsed: float


def agent_main(conf: AgentConf, results: Any, index: int) -> None:
    """Run one agent; put ``(index, role, AgentOutcome)`` on ``results``."""
    # Workers are forked from this agent process, which has torch loaded already: its own
    # forkserver would import torch again (a second per agent; a forked child of a forkserver
    # does not reuse its parent's). The agent's threads (store, keep-alive) are idle then.
    conf.start_method = "fork"
    if conf.output:
        # a forked agent inherits the forkserver's stdout, not the test's
        fd = os.open(conf.output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    spec = worker_spec(conf)
    agent = make_agent(conf, spec)
    rounds = 0
    real_rendezvous = agent._rendezvous

    def counting_rendezvous(group: Any) -> None:
        nonlocal rounds
        rounds += 1
        real_rendezvous(group)

    agent._rendezvous = counting_rendezvous
    start = time.monotonic()
    try:
        result: Any = agent.run()
    except Exception as e:
        result = f"{type(e).__name__}: {e}"
    finally:
        spec.rdzv_handler.shutdown()
    lifecycle = getattr(agent, "lifecycle", None)
    results.put((index, conf.role, AgentOutcome(
        result=result, remaining_restarts=agent._remaining_restarts,
        restart_count=lifecycle.restart_count if lifecycle is not None else 0,
        rounds=rounds, elapsed=time.monotonic() - start,
    )))
