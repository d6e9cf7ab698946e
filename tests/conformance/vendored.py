"""A vendored copy of torch elastic, built the way forks build theirs.

nvidia-resiliency-ext ships ``nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat``: torch's
``torch/distributed/elastic`` tree copied into its own package with the imports rewritten, so its
``SimpleElasticAgent``, ``WorkerState``, ``RunResult``, ``WorkerSpec``, store barrier and metrics
API are other classes and functions than torch's. :func:`vendor_torch_elastic` does the same with
the installed torch (so the copy always matches it): nothing in the copy is torch's but the parts
outside ``torch.distributed.elastic`` it imports.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch.distributed.elastic

PACKAGE = "vendored_elastic._torch_elastic_compat"


def vendor_torch_elastic(root: Path, package: str = PACKAGE) -> ModuleType:
    """Copy torch elastic to ``root/<package>``, rewrite its imports, import the copy's
    ``agent.server.api`` and return it (``root`` is put on ``sys.path``)."""
    source = Path(torch.distributed.elastic.__file__).parent
    dest = root.joinpath(*package.split("."))
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for parent in dest.parents:
        if parent == root:
            break
        (parent / "__init__.py").touch()
    for path in dest.rglob("*.py"):
        path.write_text(path.read_text().replace("torch.distributed.elastic", package))
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    return importlib.import_module(f"{package}.agent.server.api")


def unload(root: Path, package: str = PACKAGE) -> None:
    """Forget the copy: its modules and its ``sys.path`` entry."""
    top = package.split(".", maxsplit=1)[0]
    for name in [m for m in sys.modules if m == top or m.startswith(f"{top}.")]:
        del sys.modules[name]
    if str(root) in sys.path:
        sys.path.remove(str(root))
