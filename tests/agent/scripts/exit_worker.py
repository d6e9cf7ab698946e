"""Test worker for how a worker forked from the ``--preload`` template ends
(tests/agent/test_preload_exit.py): everything a normal interpreter exit does for the worker is
left pending when it ends, and the test compares what came out with a cold ``python -u`` run.

Environment:
  MODE       how it ends: "exit:N" (``sys.exit(N)``), "exit:TEXT" (``sys.exit("TEXT")``),
             "raise" (an uncaught ValueError), "record" (a ValueError under torch's @record:
             the error file), "interrupt" (an uncaught KeyboardInterrupt), "ok" (the end of
             the script)
  SIDE_FILE  a file the atexit handler, a non-daemon thread and an unclosed buffered file
             write to
  FINALIZER  "1": a module-level object whose ``__del__`` writes to stderr (only a full
             interpreter teardown runs it)

What is pending at the end: ``sys.stdout`` replaced by a fully buffered stream with unflushed
text; a file opened for writing, written, never flushed or closed; text in C's stdio buffer
(``printf`` without a newline, C's stdout fully buffered); a non-daemon thread still to write; an
``atexit`` handler (registered through ``atexit`` and through ``logging``'s own) that prints.
"""

import atexit
import ctypes
import io
import logging
import os
import sys
import threading
import time

side = os.environ["SIDE_FILE"]
mode = os.environ.get("MODE", "ok")

# a stdout whose text stays in its buffer until someone flushes it
sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False), 1 << 16),
                              write_through=False, line_buffering=False)
log_file = open(side + ".log", "w")  # noqa: SIM115 - left open on purpose
log_file.write("unflushed line in a file the worker never closed\n")


def at_exit() -> None:
    print("atexit handler: stdout")
    print("atexit handler: stderr", file=sys.stderr)
    with open(side, "a") as f:
        f.write("atexit ran\n")


atexit.register(at_exit)
handler = logging.FileHandler(side + ".logging", delay=False)
logging.getLogger("exit_worker").addHandler(handler)
logging.getLogger("exit_worker").warning("a logging record, flushed by logging.shutdown")


def late_writer() -> None:
    time.sleep(0.3)
    with open(side, "a") as f:
        f.write("non-daemon thread finished\n")


threading.Thread(target=late_writer).start()


class Finalized:
    def __del__(self) -> None:
        os.write(2, b"finalizer ran\n")


if os.environ.get("FINALIZER") == "1":
    finalized = Finalized()

libc = ctypes.CDLL(None)
# -u leaves C's stdout unbuffered; a C library may buffer it (then exit(), not _exit, flushes it)
# (a buffer of its own: -u gave the stream a one-byte one, which glibc would keep)
c_buffer = ctypes.create_string_buffer(1 << 16)
libc.setvbuf.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
libc.setvbuf(ctypes.c_void_p.in_dll(libc, "stdout"), c_buffer, 0, len(c_buffer))  # _IOFBF
libc.printf(b"C stdio text without a newline")
print("python stdout text, still in its buffer")
print("python stderr text", file=sys.stderr)

if mode.startswith("exit:"):
    value = mode.split(":", 1)[1]
    sys.exit(int(value) if value.lstrip("-").isdigit() else value)
if mode == "raise":
    raise ValueError("uncaught failure")
if mode == "record":
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def fail() -> None:
        raise ValueError("recorded failure")

    fail()
if mode == "interrupt":
    raise KeyboardInterrupt
