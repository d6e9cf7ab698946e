"""A real etcd server on loopback for the etcd rendezvous tests (Debian's ``etcd-server`` 3.4,
its v2 API on: torch's ``etcd`` and ``etcd-v2`` backends speak it through python-etcd).

:class:`EtcdServer` runs ``etcd`` in a temporary data directory, its client and peer ports free
loopback ports (``127.0.0.1`` only), and waits until it answers. The ``etcd`` fixture
(``tests/job/conftest.py``) skips, with the reason, when ``etcd`` or python-etcd is missing or
the server does not come up, and fails instead where ``FSM_AGENT_REQUIRE_ETCD=1`` (``.ci/run``
sets it, after installing ``etcd-server``). Stopping it leaves no process and no data directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fsm_test_procs import free_port

INSTALL = ("DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server; "
           "pip install python-etcd==0.4.5 (the dev extra)")
#: set (to 1) where the tests must run: a missing etcd, or one that does not start, fails them
REQUIRE = "FSM_AGENT_REQUIRE_ETCD"


def unavailable(reason: str) -> None:
    """Skip with the reason; fail with it where :data:`REQUIRE` is set (raises either way)."""
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{REQUIRE}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


class EtcdServer:
    """One etcd member on loopback, in a data directory of its own."""

    def __init__(self) -> None:
        self.binary = shutil.which("etcd")
        self.data_dir = Path(tempfile.mkdtemp(prefix="fsm-agent-etcd-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT``: what ``--rdzv-endpoint`` takes."""
        return f"127.0.0.1:{self.port}"

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            lines = (self.data_dir / "etcd.log").read_text(errors="replace").splitlines()
            return "\n".join(lines[-10:])
        return "(no log)"

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/v2/keys/", timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start(self, timeout: float = 30.0) -> None:
        """Start the server; raise ``RuntimeError`` (with its log's tail) if it does not answer."""
        assert self.binary is not None
        for _ in range(3):  # a free port may be taken between the probe and etcd's bind
            self.port, peer = free_port(), free_port()
            client_url, peer_url = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{peer}"
            cmd = [self.binary, "--name", "fsm", "--data-dir", str(self.data_dir / "data"),
                   "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                   "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                   "--initial-cluster", f"fsm={peer_url}", "--enable-v2=true",
                   "--log-level", "warn"]
            with open(self.data_dir / "etcd.log", "wb") as log:
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                if self._answers():
                    return
                time.sleep(0.1)
            self.stop(keep_dir=True)
        raise RuntimeError(f"etcd did not come up on loopback:\n{self._log_tail()}")

    def stop(self, *, keep_dir: bool = False) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its data directory."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not keep_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def etcd_server() -> EtcdServer:
    """A started server, or skip (fail under :data:`REQUIRE`) saying what is missing."""
    if shutil.which("etcd") is None:
        unavailable(f"etcd is not installed (no etcd on PATH): {INSTALL}")
    try:
        import etcd  # noqa: F401  (python-etcd: torch's etcd backends need it)
    except ImportError:
        unavailable(f"python-etcd is not installed: {INSTALL}")
    server = EtcdServer()
    try:
        server.start()
    except RuntimeError as e:
        server.stop()
        unavailable(str(e))
    return server
