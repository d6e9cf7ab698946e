"""``fsm-agent run`` logs what torchrun logs: under ``LOGLEVEL=INFO`` every line torchrun prints
for the same job appears in ``fsm-agent run``'s output, in the same order and the same layout
(``I1203 03:13:59.104000 PID path:line] text``); fsm-agent may add lines of its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fsm_torch_helpers import Jobs

HELLO = "import os\nprint('hello from rank', os.environ['RANK'], flush=True)\n"
# torch's layout: level letter, MMDD time.micros, pid, file:line]
PREFIX = re.compile(r"^([IWEC])\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ \S+:\d+\] ?(.*)$")
# what differs from run to run (ids, ports, directories, durations), and where the stores are:
# torchrun tells the workers "localhost", fsm-agent "127.0.0.1" (its stores listen on loopback)
VOLATILE = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<id>"),
    (re.compile(r"master_port=\d+"), "master_port=<port>"),
    (re.compile(r"master_addr=(localhost|127\.0\.0\.1)"), "master_addr=<loopback>"),
    (re.compile(r"/tmp/\S*torchelastic_\w+"), "<log_dir>"),
    (re.compile(r"Elapsed: [0-9.e-]+ seconds"), "Elapsed: <t> seconds"),
    (re.compile(r"entrypoint: \S*python\S*"), "entrypoint: <python>"),
]


def _lines(output: str) -> list[tuple[str, str]]:
    out = []
    for line in output.splitlines():
        m = PREFIX.match(line)
        if m:
            text = m.group(2)
            for pattern, repl in VOLATILE:
                text = pattern.sub(repl, text)
            out.append((m.group(1), text))
    return out


@pytest.mark.timeout(120)
def test_info_log_lines_and_layout_match_torchrun(jobs: Jobs, tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text(HELLO)
    args = ["--standalone", "--nproc-per-node", "2"]
    env = {"LOGLEVEL": "INFO"}
    torchrun = jobs.start(args, script, launcher="torchrun", env=env, name="torchrun")
    assert torchrun.wait(90) == 0, torchrun.output
    ours = jobs.start(args, script, env=env, name="fsm")
    assert ours.wait(90) == 0, ours.output
    want, got = _lines(torchrun.output), _lines(ours.output)
    assert len(want) >= 40, torchrun.output  # torch 2.13: 48 INFO lines, 4 WARNING
    # every torchrun line, in order, as a subsequence of ours
    it = iter(got)
    missing = [line for line in want if line not in it]
    assert not missing, "\n".join(f"{lvl} {text}" for lvl, text in missing)
    # and fsm-agent's own lines are in torch's layout too
    assert any(path.startswith("fsm_agent/") for path in re.findall(
        r"^[IWEC]\d{4} \S+ \d+ (\S+):\d+\]", ours.output, re.M))
