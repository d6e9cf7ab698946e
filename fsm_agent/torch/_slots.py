"""Stable rank slots: across a membership change survivors keep their group rank, a newcomer
takes a lost node's (docs/job-protocol.md, "Stable rank slots"; the ``resilient`` spec's
parameter ``stable_slots``).

torch's behaviour (2.13, ``dynamic_rendezvous.py``): when a round of the c10d (or etcd-v2)
rendezvous completes, ``_DistributedRendezvousOpExecutor._mark_rendezvous_complete`` numbers the
participants ``enumerate(sorted(state.participants))``: by node descriptor ``(addr, pid,
local_id)``, every round afresh. When node A (group rank 0) of a two-node job is lost and a spare
C joins, the survivor B becomes group rank 0 and C group rank 1: every worker of B changes its
global ranks, so whatever a rank owns (its shard of the data, its checkpoint files, its place in
a pipeline) moves to another machine on every membership change.

Here the same method is overridden in a subclass of torch's executor, :class:`SlotsOpExecutor`.
It calls torch's method (the round is marked complete exactly as before, ranks and all), then
renumbers with :func:`assign_slots`: each participant whose slot in the last completed round is
still a rank of this round (``< len(participants)``) and not yet taken keeps it; the others
(newcomers, and survivors whose old slot is past the end of a smaller world) fill the free ranks
in torch's order (sorted node descriptors). The result is always a permutation of
``range(len(participants))``, and without any previous slot it is torch's numbering.

The previous round's numbering cannot be read off ``state.participants``: a node leaving the
completed round (the start of every ``next_rendezvous``) removes itself, and the round's next
participants join with rank 0. So the map of the last completed round is kept on the
``_RendezvousState`` itself as the extra attribute ``slots`` (``dict[_NodeDesc, int]``). The
state is pickled whole into the rendezvous store at every sync (``_BackendRendezvousStateHolder``)
and survives the rounds, and the write is torch's compare-and-set: the node whose completion wins
the set is the one whose numbering every node reads. A survivor's ``_NodeDesc`` is the same
agent process (one handler per agent for the whole run), so the same key across rounds. The rank
torch hands out is read by ``DynamicRendezvousHandler._get_world`` from
``state.participants[this_node]``, which now holds the slot; the fast path
(``fsm_agent.torch._fastpath``) swaps only module-level helpers and the state cache, which the
subclass leaves to torch's ``run``.

How it is installed: :func:`install_stable_slots` replaces the ``_op_executor`` of the one
``DynamicRendezvousHandler`` of the run with a :class:`SlotsOpExecutor` built from the same
node, state holder and settings (the agent does it at construction when the spec's
``stable_slots`` is true). Not a handler registered in torch's ``rendezvous_handler_registry``:
the registry is keyed by backend name and process-wide, so either ``c10d`` would be replaced for
every agent of the process (the torch presets included, which must keep torch's numbering), or
users would have to name another backend on the command line; and the handler torch's c10d
factory builds (who hosts the store, ``is_host``, timeouts, the bounded store wrapper) stays
exactly torch's.

Limits:

- every agent of the job must use stable slots: an agent with torch's executor that completes a
  round numbers it torch's way and leaves the saved map stale (the next stable round still gives
  valid, contiguous ranks, from that stale map);
- only group ranks are kept; a world that shrinks renumbers the nodes whose slot no longer
  exists, and a slot a lost node held is not reserved for long: the map is the last completed
  round's only (a node lost two rounds ago has no slot);
- the ``static`` backend has fixed ranks anyway, and other handlers (not a
  ``DynamicRendezvousHandler``) are left alone; tested on c10d.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from fsm_agent.torch._compat import enabled

__all__ = ["SLOTS_ATTR", "STABLE_SLOTS_PARAM", "assign_slots", "install_stable_slots",
           "spares_wait"]

logger = logging.getLogger("fsm_agent.torch")

#: The spec parameter that turns stable slots on.
STABLE_SLOTS_PARAM = "stable_slots"
#: The attribute of torch's ``_RendezvousState`` holding the last completed round's slots.
SLOTS_ATTR = "slots"

N = TypeVar("N")


def assign_slots(previous: Mapping[N, int], participants: Iterable[N]) -> dict[N, int]:
    """The ranks of a completed round: each participant keeps its ``previous`` slot when it is
    a rank of this round and nobody took it first; the others fill the free ranks in sorted
    order. Always a permutation of ``range(len(participants))``."""
    nodes = sorted(participants)  # type: ignore[type-var]
    size = len(nodes)
    slots: dict[N, int] = {}
    taken: set[int] = set()
    for node in nodes:
        slot = previous.get(node)
        if isinstance(slot, int) and 0 <= slot < size and slot not in taken:
            slots[node] = slot
            taken.add(slot)
    free = iter(r for r in range(size) if r not in taken)
    for node in nodes:
        if node not in slots:
            slots[node] = next(free)
    return slots


def spares_wait(state: Any, max_nodes: int) -> None:
    """A round that completes full leaves its waiting nodes in torch's redundancy list.

    torch's join (2.13, ``_RendezvousJoinOp``) puts a node that finds the round complete with
    room to spare on the wait list, and one that finds it full on the redundancy list, but never
    moves a node already waiting when a round fills up: it stays on the wait list, every
    participant's ``num_nodes_waiting`` counts it, the group restarts for it at once, the next
    round fills up again without it, and so on. With two spares after a loss that storm never
    settles (``tests/agent/test_spares.py``). A waiting node that cannot take part is a spare:
    in the redundancy list it waits as torch's own spares do, and joins the wait list again as
    soon as the round loses a participant.
    """
    if len(state.participants) < max_nodes or not state.wait_list:
        return
    waiting = sorted(state.wait_list)
    state.redundancy_list.update(waiting)
    state.wait_list.clear()
    logger.info("rendezvous round %s is full: %s wait as spares", state.round,
                ", ".join(map(str, waiting)))


def _executor_class() -> type[Any]:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn

    base: type[Any] = dyn._DistributedRendezvousOpExecutor

    class SlotsOpExecutor(base):  # type: ignore[misc, valid-type]
        """torch's executor; a completed round keeps the last completed round's slots."""

        def _mark_rendezvous_complete(self) -> None:
            super()._mark_rendezvous_complete()
            state = self._state
            spares_wait(state, self._settings.max_nodes)
            previous = getattr(state, SLOTS_ATTR, None)
            slots = assign_slots(previous if isinstance(previous, dict) else {},
                                 state.participants)
            for node, slot in slots.items():
                state.participants[node] = slot
            setattr(state, SLOTS_ATTR, dict(slots))
            # every completed round, the first too: the membership trace validation
            # (tests/membership_trace.py) reads the rounds off these lines
            logger.info("rendezvous round %s: stable slots %s",
                        state.round,
                        ", ".join(f"{n}={s}" for n, s in sorted(slots.items(),
                                                                key=lambda i: i[1])))

    return SlotsOpExecutor


_CLASS: list[type[Any]] = []


def slots_executor_class() -> type[Any]:
    """:class:`SlotsOpExecutor` (built on first use: torch is imported then)."""
    if not _CLASS:
        _CLASS.append(_executor_class())
    return _CLASS[0]


def install_stable_slots(handler: Any) -> bool:
    """Give ``handler`` (a ``DynamicRendezvousHandler``) stable slots; whether it did.

    Any other handler, or a torch without the internals (``_compat``'s ``stable_slots``), is
    left alone. Installing twice is a no-op.
    """
    if not enabled("stable_slots"):
        return False
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn

    if not isinstance(handler, dyn.DynamicRendezvousHandler):
        return False
    executor = getattr(handler, "_op_executor", None)
    cls = slots_executor_class()
    if isinstance(executor, cls):
        return True
    if type(executor) is not dyn._DistributedRendezvousOpExecutor:
        return False  # someone else's executor: not ours to replace
    handler._op_executor = cls(handler._this_node, handler._state_holder, handler._settings)
    return True
