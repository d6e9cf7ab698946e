#!/usr/bin/env bash
# Run the torch-free part of the suite on other Python versions (torch's wheel on this disk is
# for Python 3.11 only; pip would download a CUDA build of several GB for any other).
#
#   compat/run_pythons.sh                 # 3.10, 3.12 and 3.13
#   compat/run_pythons.sh 3.13 -k spec    # one version, pytest arguments after it
#
# Interpreters, without a download: PYTHON3_13=/path/to/python (per version), else pyenv's
# (this project's machines ship CPython 3.10.13, 3.12.1 and 3.13.0 there), else python3.13 on
# PATH, else `uv python find`. Without torch, tests/conftest.py skips what needs it (docs/compat.md).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -gt 0 ] && [[ "$1" =~ ^3\.[0-9]+$ ]]; then versions=("$1"); shift; else
    versions=(3.10 3.12 3.13); fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
git -C "$root" archive HEAD | tar -x -C "$src"
status=0
for v in "${versions[@]}"; do
    var="PYTHON${v/./_}"
    py="${!var:-}"
    if [ -z "$py" ] && command -v pyenv >/dev/null; then
        found="$(pyenv versions --bare | grep -E "^${v//./\\.}\.[0-9]+$" | tail -1 || true)"
        [ -z "$found" ] || py="$(pyenv root)/versions/$found/bin/python$v"
    fi
    # (a pyenv shim on PATH may name a version it will not run: try it)
    if [ -z "$py" ] && "python$v" -c "" 2>/dev/null; then py="$(command -v "python$v")"; fi
    if [ -z "$py" ]; then py="$(uv python find "$v" 2>/dev/null || true)"; fi
    if [ -z "$py" ] || ! "$py" -c "" 2>/dev/null; then
        echo "== Python $v: no interpreter found (set $var)" >&2; status=1; continue
    fi
    venv="${VENV_ROOT:-/tmp}/fsm-agent-py$v"
    echo "== Python $v: $py"
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    # pyproject.toml's dependencies but torch (same ranges), the test tools; then the project
    # itself without its dependencies
    "$venv/bin/pip" install -q "transitions>=0.9.1,<0.10" "attrs>=23.1" "PyYAML>=6.0" \
        "hypothesis>=6.100" pygraphviz numpy "pytest>=8" "pytest-timeout>=2.3" hatchling
    "$venv/bin/pip" install -q --no-deps --force-reinstall "$src"
    (cd "$src" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@") || status=1
done
exit $status
