#!/usr/bin/env bash
# Build a release of lab-gpu-queue into dist/: the sdist, and a wheel for this machine's Python
# built from that sdist, checked. Usage: bash scripts/release.sh (PYTHON=... picks the
# interpreter, default python3; OUT=... the folder, default dist). It makes a throwaway venv
# with `build` and `auditwheel` (from PyPI); `build` fetches pyproject.toml's build
# requirements into an isolated environment, so the interpreter's own setuptools (often too old
# for the SPDX license field) does not matter.
#
# Why the last part prints where a compiler is needed: gpuq has one C extension
# (gpuq.agent._supervise), and the `gpuq` command is a C program (gpuq/cli/fast/stub.c), so a
# wheel fits exactly one CPython version and platform. Everywhere
# else pip builds from the sdist, which takes gcc and the Python headers.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-dist}
rm -rf "$OUT"
mkdir -p "$OUT"
TOOLS=$(mktemp -d "${TMPDIR:-/tmp}/gpuq-release.XXXXXX")
trap 'rm -rf "$TOOLS"' EXIT
"$PYTHON" -m venv "$TOOLS/venv"
"$TOOLS/venv/bin/pip" install --quiet build
# auditwheel too, where its registry answers (the check below says when it did not)
"$TOOLS/venv/bin/pip" install --quiet auditwheel 2>/dev/null || true
PATH="$TOOLS/venv/bin:$PATH"

echo "== sdist and wheel (the wheel built from the sdist: a missing file fails here)"
"$TOOLS/venv/bin/python" -m build --outdir "$OUT" . >"$TOOLS/build.log" 2>&1 || {
    tail -30 "$TOOLS/build.log" >&2
    exit 1
}
SDIST=$(ls "$OUT"/*.tar.gz)
echo "$SDIST"
# the C sources must travel in the sdist, or every machine without a wheel fails to build
LISTING=$(tar -tzf "$SDIST")
for needed in setup.py gpuq/agent/native/supervisor.c gpuq/agent/native/supervise.h \
    gpuq/migrations/env.py scripts/gpuq-py gpuq/cli/fast/stub.c; do
    if ! grep -qx "[^/]*/$needed" <<<"$LISTING"; then
        echo "release: $SDIST lacks $needed" >&2
        exit 1
    fi
done

WHEEL=$(ls "$OUT"/*.whl)
echo "$WHEEL"
if ! "$PYTHON" -m zipfile -l "$WHEEL" | grep "gpuq/agent/_supervise\..*\.so" >/dev/null; then
    echo "release: $WHEEL lacks the C extension gpuq/agent/_supervise" >&2
    exit 1
fi
# the `gpuq` command is a C program (gpuq/cli/fast/stub.c), the Python stub beside it
for script in gpuq gpuq-py; do
    if ! "$PYTHON" -m zipfile -l "$WHEEL" | grep "\.data/scripts/$script " >/dev/null; then
        echo "release: $WHEEL lacks the script $script" >&2
        exit 1
    fi
done

echo "== auditwheel"
if command -v auditwheel >/dev/null; then
    auditwheel show "$WHEEL"
    echo "(PyPI takes only manylinux/musllinux tags: \`auditwheel repair $WHEEL\` makes one)"
else
    echo "auditwheel not installed (pip install auditwheel): the wheel's external libraries and"
    echo "manylinux tag were not checked; PyPI refuses a plain linux_* wheel"
fi

echo "== where a compiler is needed"
TAG=$(basename "$WHEEL" .whl | cut -d- -f3-)
cat <<EOF
This wheel fits $TAG only (one CPython version and platform).
Everywhere else \`pip install lab-gpu-queue\` builds the C extension from the sdist and needs
a C compiler and the Python headers:
  Debian, Ubuntu:        apt install build-essential python3-dev python3-venv
  Fedora, RHEL, Rocky:   dnf install gcc python3-devel
  Alpine (musl):         apk add build-base python3-dev
EOF
