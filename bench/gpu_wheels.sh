#!/usr/bin/env bash
# The wheels bench/gpu_check.sh needs on a GPU machine that cannot reach PyPI, into .whl/ (git ignores it).
#
#   bench/gpu_wheels.sh          # here, where pip reaches PyPI; then carry .whl/ with the checkout
#
# Such a machine (this workplace's: see its device notes) has Python 3.12 with torch, torchvision,
# numpy, Pillow, pandas, pyarrow, typer, rich, xxhash, tensorboard, PyYAML and attrs, but none of
# the names below: pipe's other runtime dependencies and theirs. Each is fetched at the version this
# checkout's Python has installed (the one the tests ran with), as an x86-64 manylinux wheel for
# PYVER (default 3.12); gpu_check.sh installs whatever .whl/ holds into its work folder and checks
# every import before it builds any data, so a name missing here is named there.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
PYVER=${PYVER:-3.12}
NAMES=(chardet webdataset braceexpand simplejpeg cykooz-resizer ftfy wcwidth jsonschema jsonschema-specifications
       referencing rpds-py fastjsonschema)
pins=$("$PY" - "${NAMES[@]}" <<'EOF'
import importlib.metadata as md, sys
missing = []
for name in sys.argv[1:]:
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        missing.append(name)
if missing:
    sys.exit(f"gpu_wheels: not installed in this Python, so no version to match: {', '.join(missing)}")
EOF
)
mkdir -p .whl
platforms=()
for tag in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64 \
           manylinux_2_34_x86_64 manylinux1_x86_64 linux_x86_64; do
  platforms+=(--platform "$tag")
done
# shellcheck disable=SC2086  # one requirement a word
"$PY" -m pip download --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp "${platforms[@]}" \
  -d .whl $pins
echo "gpu_wheels: $(find .whl -name '*.whl' | wc -l) wheels in .whl/ ($(du -sh .whl | cut -f1)); carry .whl with the checkout"
