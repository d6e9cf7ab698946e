"""A program that runs ``fsm_agent.torch.launch`` itself, with the ``resilient`` preset, and
watches torch's own ``worker_group.state`` while the lifecycle is in BACKOFF.

A thread samples ``agent.get_worker_group().state`` and the lifecycle's state every few
milliseconds; a listener records the same at every transition. Both go to
``$OUT_DIR/watch.json`` when the job is over. Arguments: the worker script, then
``NAME=VALUE`` spec parameters.
"""

import json
import os
import sys
import threading
import time
import uuid

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig

from fsm_agent.torch import launch


def main() -> int:
    script, *pairs = sys.argv[1:]
    params = dict(p.split("=", 1) for p in pairs)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, run_id=uuid.uuid4().hex,
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=2,
                          monitor_interval=0.05, local_addr="127.0.0.1")
    agent_box = []
    samples, steps = [], []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            agent = agent_box[0]
            lifecycle = agent.lifecycle
            if lifecycle is not None:
                samples.append((time.monotonic(), lifecycle.state_name,
                                agent.get_worker_group().state.name, lifecycle.state.name))
            time.sleep(0.005)

    def on_agent(agent) -> None:
        agent_box.append(agent)
        threading.Thread(target=sample, daemon=True).start()

    def listener(step) -> None:
        agent = agent_box[0]
        steps.append({"dest": step.dest, "start": step.monotonic_time, "time": time.monotonic(),
                      "group": agent.get_worker_group().state.name,
                      "reported": agent.lifecycle.state.name})

    try:
        launch(config, sys.executable, [script], lifecycle_spec="resilient",
               lifecycle_params=params, listeners=[listener], on_agent=on_agent)
        code = 0
    except ChildFailedError:
        code = 1
    done.set()
    with open(os.path.join(os.environ["OUT_DIR"], "watch.json"), "w") as f:
        json.dump({"samples": samples, "steps": steps}, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
