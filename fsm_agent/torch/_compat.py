"""Every private part of torch that ``fsm_agent.torch`` relies on, in one table, checked once.

torch's elastic agent has no public hooks for what the adapter does (run loop, rendezvous waits,
worker stores, process contexts, watchdog), so the adapter uses torch's internals. Each use is a
:class:`TouchPoint` of :data:`TOUCH_POINTS`, grouped by the :data:`FEATURES` that need it:

- ``core``: the agent's own hooks (``_rendezvous``, ``_start_workers``, ...). Without them the
  adapter cannot run at all: :func:`require_core` raises :class:`TorchCompatError` naming what is
  missing, before anything starts.
- every other feature is an improvement over torch's behaviour. When the installed torch lacks
  one of its touch points, :func:`enabled` reports it off, the code that needs it falls back to
  what torch does, and one line says so (once per process, when the first agent is built).

A touch point is checked by looking at torch, not by calling it: a module attribute exists, a
class attribute exists, an ``__init__`` in the class' MRO assigns an instance attribute, or a
callable accepts a keyword. docs/compat.md lists the torch versions this was run on.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Iterable
from typing import Any

import attrs

__all__ = [
    "FEATURES",
    "TOUCH_POINTS",
    "TorchCompatError",
    "TouchPoint",
    "check",
    "enabled",
    "missing",
    "require_core",
    "reset",
]

logger = logging.getLogger("fsm_agent.torch")

_API = "torch.distributed.elastic.agent.server.api"
_LOCAL = "torch.distributed.elastic.agent.server.local_elastic_agent"
_DYN = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
_C10D = "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend"
_ETCD = "torch.distributed.elastic.rendezvous.etcd_rendezvous"
_MP = "torch.distributed.elastic.multiprocessing.api"
_TIMER = "torch.distributed.elastic.timer.file_based_local_timer"

#: What each feature does for the user, and what happens without it (the logged line).
FEATURES: dict[str, str] = {
    "core": "the spec-driven run loop (the adapter itself)",
    "barrier": "an exit barrier a termination signal can interrupt; without it torch's barrier "
               "holds a SIGTERM off until the barrier ends",
    "fastpath": "rendezvous without torch's needless sleeps and stack walks, and membership "
                "checks from torch's cached state; without it a restart takes torch's time",
    "isolation": "a fresh worker store per rendezvous round; without it restarted workers share "
                 "the agent's store as in torch (stale gloo addresses, pytorch/pytorch#135712)",
    "loopback": "loopback-only stores for a local rendezvous; without it they listen on every "
                "interface, as in torch",
    "wakeup": "waking the monitor when a worker exits; without it the agent looks every "
              "monitor_interval, as torch's loop",
    "hang_watchdog": "hung workers reported UNHEALTHY to the lifecycle; without it torch's own "
                     "watchdog handles them",
    "reaper": "stopping the processes a worker started in its own session; without it they may "
              "outlive the workers, as under torch",
    "clean_slate": "no process of an earlier attempt (a worker's setsid child) running when the "
                   "workers start again; without it such processes run on beside them, as under "
                   "torch",
    "preload": "--preload: script workers forked from a template that imported their modules; "
               "without it they start cold, as under torch",
    "error_files": "a worker's unreadable error file is that failure's message; without it the "
                   "agent ends at the first such failure, as torch",
    "bounded_store": "rendezvous-state store calls that end within the store's timeout; without "
                     "it a partitioned agent waits in them as long as the partition lasts, as "
                     "under torch (the job protocol's own calls stay bounded)",
    "stable_slots": "stable rank slots (the spec parameter stable_slots): survivors keep their "
                    "group rank across a membership change; without it ranks are renumbered "
                    "every round, as in torch",
    "peer_watch": "lost peers read off the rendezvous keep-alive (the guard peer_lost); without "
                  "it a failure that follows a lost node is classified as any other failure, "
                  "as in torch",
    "etcd_job": "the job protocol (one outcome, the job-wide budget) on torch's etcd and etcd-v2 "
                "rendezvous; without it their agents decide alone, as torch's",
}


@attrs.frozen
class TouchPoint:
    """One private part of torch. ``kind``: ``attr`` (``module:Qual.name`` exists), ``init``
    (an ``__init__`` of ``module:Class`` or its bases assigns ``self.<name>``) or ``param``
    (the callable ``module:Qual.name`` takes the keyword ``<name>``)."""

    feature: str
    kind: str
    target: str
    name: str = ""

    def __str__(self) -> str:
        where = self.target.replace(":", ".")
        if self.kind == "init":
            return f"{where}().{self.name}"
        if self.kind == "param":
            return f"{where}({self.name}=...)"
        return where

    def present(self) -> bool:
        """Whether the installed torch has it (never raises)."""
        try:
            obj = _resolve(self.target)
        except (ImportError, AttributeError):
            return False
        if self.kind == "attr":
            return True
        if self.kind == "init":
            return _assigned_in_init(obj, self.name)
        if self.kind == "param":
            return _takes_keyword(obj, self.name)
        raise ValueError(f"unknown touch point kind {self.kind!r}")


def _resolve(target: str) -> Any:
    module, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split(".") if qualname else ():
        obj = getattr(obj, part)
    return obj


def _assigned_in_init(cls: Any, name: str) -> bool:
    # STORE_ATTR names are in the code object's co_names: no instance needed.
    for klass in getattr(cls, "__mro__", ()):
        init = vars(klass).get("__init__")
        code = getattr(init, "__code__", None)
        if code is not None and name in code.co_names:
            return True
    return False


def _takes_keyword(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a pybind11 callable: its signatures are in the docstring
        return f"{name}:" in (getattr(fn, "__doc__", None) or "")


def _points(feature: str, kind: str, target: str, *names: str) -> list[TouchPoint]:
    if kind == "attr":
        return [TouchPoint(feature, kind, f"{target}.{n}" if ":" in target else f"{target}:{n}")
                for n in names]
    return [TouchPoint(feature, kind, target, n) for n in names]


#: Every private part of torch the adapter uses (module, class and instance attributes).
TOUCH_POINTS: tuple[TouchPoint, ...] = (
    # the agent's hooks, called by TorchDriver and the mixin (_driver.py, _agent.py)
    *_points("core", "attr", f"{_API}:SimpleElasticAgent", "_invoke_run", "_rendezvous",
             "_start_workers", "_stop_workers", "_monitor_workers", "_shutdown",
             "_record_metrics", "_record_worker_events", "_construct_event"),
    *_points("core", "init", f"{_API}:SimpleElasticAgent", "_worker_group",
             "_remaining_restarts", "_exit_barrier_timeout", "_store", "_in_exit_barrier",
             "_total_execution_time"),
    *_points("core", "attr", _API, "_TERMINAL_STATE_SYNC_ID"),
    *_points("core", "init", f"{_LOCAL}:LocalElasticAgent", "_pcontext"),
    # torch's launch_agent helpers, reused by launch() (_launch.py)
    *_points("core", "attr", "torch.distributed.launcher.api", "_get_addr_and_port",
             "_get_entrypoint_name"),
    # _barrier.py: torch's barrier protocol, polled
    *_points("barrier", "attr", "torch.distributed.elastic.utils.store", "_barrier_nonblocking"),
    # _fastpath.py
    *_points("fastpath", "attr", _DYN, "_delay", "get_method_name"),
    *_points("fastpath", "init", f"{_DYN}:DynamicRendezvousHandler", "_state_holder"),
    *_points("fastpath", "init", f"{_DYN}:_BackendRendezvousStateHolder", "_cache_duration",
             "_dirty", "_last_sync_time", "_state"),
    *_points("fastpath", "attr", f"{_DYN}:_BackendRendezvousStateHolder", "sync"),
    *_points("fastpath", "init", f"{_DYN}:_RendezvousState", "wait_list"),
    # _isolation.py: the c10d handler's per-agent cache of the workers' store
    *_points("isolation", "init", f"{_DYN}:DynamicRendezvousHandler", "_bootstrap_store_info",
             "_shared_tcp_store_server"),
    # _loopback.py
    *_points("loopback", "attr", f"{_DYN}:DynamicRendezvousHandler", "_create_tcp_store_server"),
    *_points("loopback", "param", "torch.distributed:TCPStore.__init__", "master_listen_fd"),
    # _wakeup.py and _tick.py: the workers' processes and return-value pipes
    *_points("wakeup", "init", f"{_MP}:SubprocessContext", "subprocess_handlers"),
    *_points("wakeup", "init",
             "torch.distributed.elastic.multiprocessing.subprocess_handler:SubprocessHandler",
             "proc"),
    *_points("wakeup", "init", f"{_MP}:MultiprocessContext", "_pc", "_ret_vals"),
    # _file_timer.py: torch's file-timer watchdog, subclassed
    *_points("hang_watchdog", "attr", f"{_TIMER}:FileTimerServer", "_reap_worker"),
    *_points("hang_watchdog", "init", f"{_TIMER}:FileTimerServer", "_log_event", "_file_path"),
    *_points("hang_watchdog", "attr", f"{_LOCAL}:LocalElasticAgent", "_setup_local_watchdog",
             "_log_watchdog_event"),
    *_points("hang_watchdog", "init", f"{_LOCAL}:LocalElasticAgent", "_worker_watchdog"),
    # _preload.py: SubprocessContext._start looks the handler factory up in its module; the
    # handler is torch's, with _popen overridden, and hands its redirect files to the fork
    *_points("preload", "attr", _MP, "get_subprocess_handler"),
    *_points("preload", "attr",
             "torch.distributed.elastic.multiprocessing.subprocess_handler:SubprocessHandler",
             "_popen"),
    *_points("preload", "init",
             "torch.distributed.elastic.multiprocessing.subprocess_handler:SubprocessHandler",
             "_stdout", "_stderr", "proc"),
    # _errorfiles.py: the failures multiprocessing.api builds, tolerant of unreadable files
    *_points("error_files", "attr", _MP, "ProcessFailure"),
    *_points("error_files", "attr",
             "torch.distributed.elastic.multiprocessing.errors:ProcessFailure", "__post_init__"),
    # _bounded.py: the c10d backend's store, wrapped
    *_points("bounded_store", "init", f"{_DYN}:_BackendRendezvousStateHolder", "_backend"),
    *_points("bounded_store", "init", f"{_C10D}:C10dRendezvousBackend", "_store"),
    *_points("bounded_store", "attr", f"{_C10D}:C10dRendezvousBackend", "_call_store"),
    # _slots.py: the executor whose round completion is overridden
    *_points("stable_slots", "attr", f"{_DYN}:_DistributedRendezvousOpExecutor",
             "_mark_rendezvous_complete"),
    *_points("stable_slots", "init", f"{_DYN}:DynamicRendezvousHandler", "_op_executor",
             "_this_node", "_state_holder", "_settings"),
    # ... and a full round's waiting nodes turned into spares (spares_wait)
    *_points("stable_slots", "init", f"{_DYN}:_RendezvousState", "participants", "wait_list",
             "redundancy_list"),
    # _peers.py: the state holder's dead-node sweep, wrapped, and its state read afresh
    *_points("peer_watch", "attr", f"{_DYN}:_BackendRendezvousStateHolder", "_sanitize"),
    *_points("peer_watch", "init", f"{_DYN}:_BackendRendezvousStateHolder", "_dead_nodes",
             "_last_sync_time"),
    *_points("peer_watch", "init", f"{_DYN}:_RendezvousState", "participants",
             "last_heartbeats"),
    *_points("peer_watch", "init", f"{_DYN}:DynamicRendezvousHandler", "_heartbeat_lock",
             "_state_holder", "_this_node", "_settings"),
    # ... and the round's MASTER_ADDR wait, made abortable when its rank 0 is lost
    *_points("peer_watch", "attr", "torch.distributed.elastic.rendezvous.api:RendezvousStoreInfo",
             "build", "MASTER_ADDR_KEY"),
    # _slate.py: torch hands every worker's environment to this hook just before the start
    *_points("clean_slate", "attr", f"{_LOCAL}:LocalElasticAgent", "_setup_local_watchdog"),
    # _etcd.py: the etcd handlers' client, and the etcd (v1) rendezvous' waits, polled
    *_points("etcd_job", "init", f"{_ETCD}:EtcdRendezvousHandler", "_rdzv_impl"),
    *_points("etcd_job", "init", f"{_ETCD}:EtcdRendezvous", "client", "_prefix",
             "_num_max_workers"),
    *_points("etcd_job", "attr", f"{_ETCD}:EtcdRendezvous", "try_wait_for_state_change",
             "get_rdzv_state"),
    *_points("etcd_job", "init", "torch.distributed.elastic.rendezvous.etcd_store:EtcdStore",
             "client", "prefix"),
    # _reaper.py
    *_points("reaper", "init", f"{_MP}:SubprocessContext", "subprocess_handlers"),
    *_points("reaper", "init",
             "torch.distributed.elastic.multiprocessing.subprocess_handler:SubprocessHandler",
             "proc"),
)


class TorchCompatError(RuntimeError):
    """The installed torch lacks what the adapter cannot run without."""


# the start-up check's result, per process ([]: not checked yet)
_checked: list[dict[str, list[TouchPoint]]] = []


def missing(points: Iterable[TouchPoint] | None = None) -> dict[str, list[TouchPoint]]:
    """The touch points (default: :data:`TOUCH_POINTS`) the installed torch lacks, by feature
    (checked afresh)."""
    out: dict[str, list[TouchPoint]] = {}
    for point in TOUCH_POINTS if points is None else points:
        if not point.present():
            out.setdefault(point.feature, []).append(point)
    return out


def check() -> dict[str, list[TouchPoint]]:
    """Check every touch point once per process; log one line per feature that is off."""
    if not _checked:
        _checked.append(missing())
        version = _torch_version()
        for feature, points in _checked[0].items():
            if feature == "core":
                continue
            logger.warning(
                "fsm_agent.torch: %s off: torch %s has no %s (%s)",
                feature, version, ", ".join(str(p) for p in points), FEATURES[feature],
            )
    return _checked[0]


def enabled(feature: str) -> bool:
    """Whether ``feature`` can be used with the installed torch."""
    if feature not in FEATURES:
        raise ValueError(f"unknown feature {feature!r} (known: {', '.join(FEATURES)})")
    return feature not in check()


def require_core() -> None:
    """Raise :class:`TorchCompatError` if the installed torch lacks a ``core`` touch point."""
    lacking = check().get("core")
    if lacking:
        raise TorchCompatError(
            f"fsm_agent.torch cannot run on torch {_torch_version()}: it has no "
            f"{', '.join(str(p) for p in lacking)} (tested versions: docs/compat.md)"
        )


def reset() -> None:
    """Forget the last check (tests that change torch call this)."""
    _checked.clear()


def _torch_version() -> str:
    try:
        import torch
    except ImportError:  # pragma: no cover - the adapter imports torch first
        return "(not installed)"
    return str(getattr(torch, "__version__", "?"))
