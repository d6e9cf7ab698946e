#!/usr/bin/env bash
# Run the test suite against another torch release, in a virtual environment of its own.
#
#   compat/run_torch.sh 2.14.1                 # the whole suite
#   compat/run_torch.sh 2.14.1 tests/agent     # pytest arguments after the version
#
# The project is installed from a snapshot of the current commit (git archive), so editing the
# work tree while it runs changes nothing. The venv (VENV, default /tmp/fsm-agent-torch-VERSION)
# is kept for the next run. torch comes from wherever pip finds it: on this project's machines
# 2.13.0 (CPU, about 200 MB) and 2.14.1 (CUDA build, about 5.6 GB with its libraries) lie on
# disk; any other version is a download. Not run in CI; docs/compat.md has the results.
set -euo pipefail
version="${1:?usage: compat/run_torch.sh TORCH_VERSION [PYTEST_ARGS...]}"
shift
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${VENV:-/tmp/fsm-agent-torch-$version}"
python="${PYTHON:-python3}"
src="$venv/src"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
rm -rf "$src" && mkdir -p "$src"
git -C "$root" archive HEAD | tar -x -C "$src"
"$venv/bin/pip" install -q "torch==$version" "$src[dev]"
# the conformance kit's third-party agent (a test tool: --no-deps, pip never touches torch)
"$venv/bin/pip" install -q --no-deps torchelastic==0.2.2
"$venv/bin/python" - <<'PY'
import sys, torch
from fsm_agent.torch import _compat
lacking = _compat.missing()
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, touch points lacking: "
      f"{ {f: [str(p) for p in ps] for f, ps in lacking.items()} or 'none'}")
PY
cd "$src"
exec "$venv/bin/python" -m pytest -p no:cacheprovider "$@"
