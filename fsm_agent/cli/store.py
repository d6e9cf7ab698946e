"""``fsm-agent store``: a rendezvous store of its own, outside the training nodes.

Under torchrun the first agent at the c10d endpoint hosts the rendezvous store, so losing that
node ends every agent ("the rendezvous store is unreachable"). This command serves the same
store (torch's ``TCPStore``, the server torch's c10d backend starts) from a machine that is not a
training node: a login node, the Slurm batch host, a Kubernetes Service. Agents given its
endpoint with ``--rdzv-conf is_host=0`` are all clients (docs/multinode.md says how torch decides
otherwise).

It listens on ``--host`` only (``0.0.0.0`` or ``::`` for every interface), prints one line when
it does, and stops on SIGTERM or SIGINT with exit code 0. A port that is taken or a host that is
no address of this machine is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import errno
import signal
import socket
import sys
from collections.abc import Sequence

from ._common import OK, UsageError, make_parser, run_command, seconds_arg

__all__ = ["build_parser", "main"]

PROG = "fsm-agent store"
#: torch's c10d rendezvous port when an endpoint names none.
DEFAULT_PORT = 29400
EXAMPLES = (
    "fsm-agent store --host 0.0.0.0                  # every interface, port 29400",
    "fsm-agent store --host login1 --port 29500 --timeout 15m",
    "fsm-agent store --host 127.0.0.1 --port 0         # loopback, a free port (printed)",
)
_STOP = (signal.SIGTERM, signal.SIGINT)


def build_parser() -> argparse.ArgumentParser:
    """The ``fsm-agent store`` command line."""
    parser = make_parser(
        PROG, "Serve a c10d rendezvous store (torch's TCPStore) for fsm-agent run and torchrun "
        "agents, from a machine that is not a training node: no agent hosts it, so no node's "
        "loss takes it down. Give the agents --rdzv-endpoint HOST:PORT and --rdzv-conf "
        "is_host=0. Stops on SIGTERM or SIGINT (exit 0); exit 2 on bad input, a port that is "
        "taken or a host that is no address of this machine.", EXAMPLES)
    parser.add_argument("--host", required=True,
                        help="address (or name) of this machine to listen on; 0.0.0.0 or :: "
                             "for every interface")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port to listen on (default {DEFAULT_PORT}, torch's c10d "
                             "default; 0: one the system picks, printed)")
    parser.add_argument("--timeout", type=seconds_arg(True), default=300.0,
                        help="the store's own timeout for its waits, as TCPStore's (default "
                             "300 s; plain seconds or with a unit: 90, 10m)")
    return parser


def _serve(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: not a port (0-65535)")
    # Blocked before the store's threads start, so they inherit the mask and the signals wait
    # for sigwait below instead of reaching a C++ thread; given back for an in-process caller.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP)
    try:
        return _listen(args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _listen(args: argparse.Namespace) -> int:
    from fsm_agent.torch._loopback import listening_store

    try:
        store = listening_store(args.host, args.port, timeout=args.timeout, multi_tenant=False)
    except socket.gaierror as e:
        raise UsageError(f"--host {args.host}: no such host ({e.strerror or e})") from None
    except OSError as e:
        what = {errno.EADDRINUSE: f"--port {args.port}: already in use on {args.host} (another "
                                  "store or an agent hosting one?)",
                errno.EADDRNOTAVAIL: f"--host {args.host}: not an address of this machine"}.get(
                    e.errno or 0, f"--host {args.host} --port {args.port}: cannot listen")
        raise UsageError(f"{what} ({e.strerror or e})") from None
    print(f"{PROG}: listening on {args.host}:{store.port} (torch TCPStore, timeout "
          f"{args.timeout:g} s); agents: --rdzv-endpoint HOST:{store.port} --rdzv-conf "
          "is_host=0; stop with SIGTERM or Ctrl-C", flush=True)
    got = signal.sigwait(_STOP)
    print(f"{PROG}: stopped ({signal.Signals(got).name})", flush=True)
    del store
    return OK


def main(argv: Sequence[str]) -> int:
    """``fsm-agent store --host H [--port P]``: serve a rendezvous store until stopped."""
    return run_command(PROG, _serve, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
