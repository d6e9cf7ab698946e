"""How a worker forked from the ``--preload`` template ends (``_fast_exit`` of
``fsm_agent/torch/_template.py``): without the interpreter's teardown, but with everything a
normal exit gives the worker and the agent.

Each case runs ``tests/agent/scripts/exit_worker.py`` twice with the same environment: cold
(``python -u SCRIPT``, as torch's ``Popen`` starts it) and forked from a real template process
(the agent's own ``Template``), and compares the exit code, stdout, stderr and the files the
worker left: the error file torch's ``@record`` writes, an ``atexit`` handler's, a non-daemon
thread's, ``logging``'s, a file the worker never closed. At the end of the worker, ``sys.stdout``
is a fully buffered stream with unflushed text and C's stdio holds text too, so a fast exit that
skipped a flush, the ``atexit`` handlers or the thread join would lose something here. The same
under a real agent, through torch's redirects and ``--tee``: tests/agent/test_preload.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsm_agent.torch._preload import Template, available

SCRIPT = Path(__file__).parent / "scripts" / "exit_worker.py"
# preloaded so that the worker's @record (and torch's own atexit handlers) come from the template
PRELOAD = ("torch.distributed.elastic.multiprocessing.errors",)

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture(scope="module")
def template() -> Iterator[Template]:
    pytest.importorskip("torch")
    t = Template(PRELOAD, sys.executable, ("-u",), (str(SCRIPT),))
    t.start()
    try:
        assert t.wait_ready(), t.failed
        yield t
    finally:
        t.close()


def _run(template: Template | None, workdir: Path, env: dict[str, str]) -> dict[str, object]:
    """Run the worker (cold when ``template`` is None); what it left behind, normalized."""
    workdir.mkdir()
    side = workdir / "side"
    full_env = {**os.environ, "SIDE_FILE": str(side),
                "TORCHELASTIC_ERROR_FILE": str(workdir / "error.json"), **env}
    full_env.pop("PYTHONUNBUFFERED", None)
    argv = [sys.executable, "-u", str(SCRIPT)]
    with open(workdir / "stdout", "wb") as out, open(workdir / "stderr", "wb") as err, \
            open(os.devnull, "rb") as null:
        if template is None:
            code = subprocess.run(argv, env=full_env, stdin=null, stdout=out, stderr=err,
                                  timeout=120, check=False).returncode
        else:
            proc = template.spawn(argv, full_env, null.fileno(), out.fileno(), err.fileno())
            assert proc is not None, template.failed
            code = proc.wait(120)
    left: dict[str, object] = {"code": code}
    for path in sorted(workdir.iterdir()):
        text = path.read_text().replace(str(workdir), "<WD>")
        left[path.name] = re.sub(r'"timestamp": "\d+"', '"timestamp": "<T>"', text)
    return left


def _both(template: Template, tmp_path: Path, **env: str) -> tuple[dict[str, object], ...]:
    cold = _run(None, tmp_path / "cold", env)
    warm = _run(template, tmp_path / "warm", env)
    return cold, warm


def _same_as_cold(template: Template, tmp_path: Path, mode: str) -> dict[str, object]:
    """The forked worker's run in ``mode``, once checked equal to the cold one and complete."""
    cold, warm = _both(template, tmp_path, MODE=mode)
    assert warm == cold
    _assert_nothing_lost(warm)
    return warm


def _assert_nothing_lost(left: dict[str, object]) -> None:
    """What every run must have left, whatever its end."""
    stdout, side = str(left["stdout"]), str(left["side"])
    assert "python stdout text, still in its buffer" in stdout  # sys.stdout flushed
    assert "atexit handler: stdout" in stdout and "atexit handler: stderr" in str(left["stderr"])
    assert stdout.count("C stdio text without a newline") == 1  # C's stdio flushed
    assert side.splitlines() == ["non-daemon thread finished", "atexit ran"]  # joined first
    assert left["side.log"] == "unflushed line in a file the worker never closed\n"
    assert left["side.logging"] == "a logging record, flushed by logging.shutdown\n"


@pytest.mark.parametrize("value", ["3", "0", "256", "-1"])
def test_sys_exit_codes_are_the_interpreters(template: Template, tmp_path: Path,
                                              value: str) -> None:
    warm = _same_as_cold(template, tmp_path, f"exit:{value}")
    assert warm["code"] == int(value) & 0xFF


def test_sys_exit_with_a_message_prints_it_and_exits_1(template: Template,
                                                        tmp_path: Path) -> None:
    warm = _same_as_cold(template, tmp_path, "exit:giving up")
    assert warm["code"] == 1 and "giving up\n" in str(warm["stderr"])


def test_an_uncaught_exception_prints_the_traceback_and_exits_1(template: Template,
                                                                 tmp_path: Path) -> None:
    warm = _same_as_cold(template, tmp_path, "raise")
    assert warm["code"] == 1
    stderr = str(warm["stderr"])
    assert stderr.index("Traceback") < stderr.index("ValueError: uncaught failure") < stderr.index(
        "atexit handler: stderr")  # the report first, then the handlers, as the interpreter


def test_a_recorded_exception_writes_torchs_error_file(template: Template,
                                                       tmp_path: Path) -> None:
    warm = _same_as_cold(template, tmp_path, "record")
    assert warm["code"] == 1
    error = json.loads(str(warm["error.json"]))
    assert error["message"]["message"] == "ValueError: recorded failure"
    assert "raise ValueError(\"recorded failure\")" in error["message"]["extraInfo"]["py_callstack"]


def test_an_uncaught_keyboard_interrupt_ends_by_sigint(template: Template,
                                                       tmp_path: Path) -> None:
    warm = _same_as_cold(template, tmp_path, "interrupt")
    assert warm["code"] == -2 and "KeyboardInterrupt" in str(warm["stderr"])


def test_the_end_of_the_script_exits_0(template: Template, tmp_path: Path) -> None:
    warm = _same_as_cold(template, tmp_path, "ok")
    assert warm["code"] == 0


def test_only_the_teardown_is_skipped_unless_the_worker_asks_for_it(template: Template,
                                                                    tmp_path: Path) -> None:
    # A module-level object's __del__ is what the teardown runs and the fast exit does not
    # (docs/performance.md); FSM_AGENT_PRELOAD_FULL_EXIT=1 gives the whole teardown back.
    cold, fast = _both(template, tmp_path, MODE="exit:4", FINALIZER="1")
    full = _run(template, tmp_path / "full", {"MODE": "exit:4", "FINALIZER": "1",
                                              "FSM_AGENT_PRELOAD_FULL_EXIT": "1"})
    assert "finalizer ran" in str(cold["stderr"])
    # (the interpreter's own way out of the template's code flushes C's stdio at another point)
    assert {**full, "stdout": ""} == {**cold, "stdout": ""}
    assert sorted(str(full["stdout"])) == sorted(str(cold["stdout"]))
    assert "finalizer ran" not in str(fast["stderr"])
    assert {**fast, "stderr": ""} == {**cold, "stderr": ""}
    assert str(fast["stderr"]) == str(cold["stderr"]).replace("finalizer ran\n", "")
