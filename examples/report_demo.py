"""Run a two-agent job that hangs, crashes and recovers, and write its report.

    python examples/report_demo.py [OUT_DIR] [--screenshot PNG]

Starts two ``fsm-agent run`` agents on this machine (a c10d rendezvous on loopback, one worker
each) running ``examples/hang_then_crash.py`` under the ``resilient`` preset with
``--spec-param hang_timeout=3s``, each with ``--trace``; then ``fsm-agent report`` merges both
traces into ``OUT_DIR/report.html`` (default: a new temporary directory) and prints the text
summary. ``--screenshot`` renders the page in headless Chromium (Debian's ``chromium``) to a PNG:
how docs/report-example.png was made.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FSM = [sys.executable, "-m", "fsm_agent"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="output directory (default: a temporary one)")
    parser.add_argument("--screenshot", metavar="PNG")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="fsm_agent_report_demo_"))
    out.mkdir(parents=True, exist_ok=True)
    endpoint = f"127.0.0.1:{_free_port()}"
    common = ["run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", endpoint, "--rdzv-id", "report-demo", "--max-restarts", "3",
              "--monitor-interval", "0.1", "--spec", "resilient",
              "--spec-param", "hang_timeout=3s", "--spec-param", "backoff_initial=1s"]
    agents = []
    for name in ("node0", "node1"):
        cmd = [*FSM, *common, "--log-dir", str(out / f"logs-{name}"), "--trace",
               str(out / f"{name}.jsonl"), str(HERE / "hang_then_crash.py")]
        log = open(out / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        agents.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
    codes = []
    for proc, log in agents:
        try:
            codes.append(proc.wait(timeout=300))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    print(f"agents exited {codes}; logs in {out}")
    traces = [str(out / "node0.jsonl"), str(out / "node1.jsonl")]
    logs = [a for name in ("node0", "node1") for a in ("--log-dir", str(out / f"logs-{name}"))]
    subprocess.run([*FSM, "report", *traces, *logs, "-o", str(out / "report.html")], check=True)
    subprocess.run([*FSM, "report", *traces, "--format", "text"], check=True)
    if args.screenshot:
        browser = shutil.which("chromium") or shutil.which("chromium-browser")
        if browser is None:
            print("no chromium: no screenshot", file=sys.stderr)
            return 1
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--screenshot={os.path.abspath(args.screenshot)}",
                        "--window-size=1280,2200", (out / "report.html").as_uri()],
                       check=True, capture_output=True, timeout=120)
        print(f"wrote {args.screenshot}")
    return 0 if codes == [0, 0] else 1


if __name__ == "__main__":
    sys.exit(main())
