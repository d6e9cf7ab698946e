"""Test worker whose entry point uses torch's ``@record``: rank FAIL_RANK raises, leaving an
error file with the message MESSAGE; the other ranks exit 0 at once (without importing torch,
which is what makes a worker slow to start)."""

import os
import sys


def main() -> None:
    if os.environ["RANK"] != os.environ.get("FAIL_RANK", "1"):
        return
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def fail() -> None:
        raise ValueError(os.environ.get("MESSAGE", "deliberate failure"))

    fail()


if __name__ == "__main__":
    main()
    sys.exit(0)
