"""The warm-start template's code (``fsm_agent/torch/_template.py``), loaded from its file.

Never imported as ``fsm_agent.torch._template``: that would import the ``fsm_agent.torch``
package, and torch, into the template and so into every worker, and into ``fsm-agent run``
before it may launch the template (``fsm_agent/cli/_prestart.py``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from typing import Any

#: The file, and the module name it is loaded under in the agent and in the template.
PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch",
                    "_template.py")
NAME = "_fsm_agent_template"


def load() -> Any:
    """The module (loaded once per process)."""
    module = sys.modules.get(NAME)
    if module is None:
        spec = importlib.util.spec_from_file_location(NAME, PATH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[NAME] = module
        spec.loader.exec_module(module)
    return module


_reserved_token: str | None = None


def reserve_sentinel_token() -> str:
    """The token this process's next agent sentinel will use (``fsm_agent/torch/_sentinel.py``):
    a template launched before the agent carries it in its environment, as one launched by the
    agent does, so that the sentinel finds it and the workers forked from it."""
    global _reserved_token  # noqa: PLW0603 - one reservation per process, taken once
    if _reserved_token is None:
        _reserved_token = uuid.uuid4().hex
    return _reserved_token


def take_sentinel_token() -> str:
    """The reserved token (once), or a fresh one."""
    global _reserved_token
    token, _reserved_token = _reserved_token, None
    return token or uuid.uuid4().hex
