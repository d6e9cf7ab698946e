"""Test worker whose entry point uses torch's ``@record``: rank FAIL_RANK raises, leaving an
error file with the message ``MESSAGE``; other ranks exit 0."""

import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    if os.environ["RANK"] == os.environ.get("FAIL_RANK", "1"):
        raise ValueError(os.environ.get("MESSAGE", "deliberate failure"))


if __name__ == "__main__":
    main()
