"""A c10d rendezvous on loopback keeps its stores on loopback.

torch's ``TCPStore`` server always listens on the wildcard address (``[::]``, dual-stack, so every
IPv4 and IPv6 interface), whatever host name it is given: under ``torchrun --standalone`` (or
``--rdzv-endpoint localhost:29400``) the rendezvous store and the workers' store of every round
accept connections from the whole network, unauthenticated, although only processes of this
machine ever use them (torch 2.13, checked by ``tests/reliability/test_security.py``).

For a c10d rendezvous whose endpoint is a loopback address (``localhost``, ``127.0.0.1``, ``::1``;
``--standalone`` sets ``localhost:0``), :func:`loopback_rendezvous_handler` builds the same
handler torch builds (``registry._create_c10d_handler``: a ``TCPStore`` host or client,
``C10dRendezvousBackend``, ``create_handler``), except that each store server listens on a socket
bound to ``127.0.0.1`` and handed to ``TCPStore`` (``master_listen_fd``). With an explicit port,
as torch decides: the first agent that can bind the port hosts the store, the others connect to
it (``is_host`` in ``--rdzv-conf`` forces either). ``fsm-agent run`` also sets ``--local-addr
127.0.0.1`` for such an endpoint unless given, so the workers are told to reach their store there.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from datetime import timedelta
from typing import Any

from fsm_agent.torch._compat import enabled

__all__ = ["LOOPBACK", "is_loopback", "listening_store", "loopback_rendezvous_handler",
           "loopback_store"]

logger = logging.getLogger("fsm_agent.torch")

LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (no name lookup)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_store(port: int = 0, *, timeout: float = 300.0, multi_tenant: bool = True) -> Any:
    """A ``TCPStore`` server listening on ``127.0.0.1:port`` only."""
    return listening_store(LOOPBACK, port, timeout=timeout, multi_tenant=multi_tenant)


def listening_store(host: str, port: int = 0, *, timeout: float = 300.0,
                    multi_tenant: bool = True) -> Any:
    """A ``TCPStore`` server listening on ``host:port`` only (``0.0.0.0`` or ``::``: every
    interface). Raises ``OSError`` when the port is taken (``EADDRINUSE``), ``host`` is no
    address of this machine (``EADDRNOTAVAIL``) or does not resolve (``socket.gaierror``)."""
    import torch.distributed as dist

    family, _, _, _, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    bound = sock.getsockname()[1]
    # The store owns the descriptor from now on: Python must not close it under the store's
    # poll loop (the daemon aborts on a descriptor closed behind its back).
    fd = sock.detach()
    return dist.TCPStore(
        host.strip("[]"),
        bound,
        is_master=True,
        timeout=timedelta(seconds=timeout),
        multi_tenant=multi_tenant,
        master_listen_fd=fd,
    )


def loopback_rendezvous_handler(params: Any) -> Any | None:
    """torch's c10d handler with loopback-only stores, or None when ``params`` is not a local,
    self-hosted c10d rendezvous (then torch's registry builds the handler as usual)."""
    endpoint = params.endpoint or ""
    if params.backend != "c10d" or params.get("store_type", "tcp").strip().lower() != "tcp":
        return None
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():  # no port: torch's default (29400), torch's handler
        return None
    if not is_loopback(host) or not enabled("loopback"):
        return None
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    read_timeout = int(params.get_as_int("read_timeout", 60))
    store = _rendezvous_store(int(port), params.get_as_bool("is_host"), read_timeout)
    backend = C10dRendezvousBackend(store, params.run_id)
    handler = create_handler(store, backend, params)

    def create_tcp_store_server(master_addr: str, master_port: int) -> Any:
        # DynamicRendezvousHandler's hook for the workers' store (one per round with the
        # per-round isolation): the same, bound to loopback.
        return loopback_store(int(master_port))

    handler._create_tcp_store_server = create_tcp_store_server
    return handler


def _rendezvous_store(port: int, is_host: bool | None, timeout: float) -> Any:
    """The rendezvous store on ``127.0.0.1:port``: hosted here if the port is free (or
    ``is_host``), else a client of the agent that hosts it (or ``is_host=False``), as torch's
    ``_create_tcp_store`` decides for a host name that is this machine's."""
    import torch.distributed as dist

    if is_host is not False:
        try:
            store = loopback_store(port, timeout=timeout)
        except OSError as e:
            if is_host or port == 0:
                raise
            logger.debug("rendezvous store port %s taken (%s): joining as a client", port, e)
        else:
            logger.info("rendezvous store on %s:%s (loopback only)", LOOPBACK, store.port)
            return store
    return dist.TCPStore(LOOPBACK, port, is_master=False, multi_tenant=True,
                         timeout=timedelta(seconds=timeout))
