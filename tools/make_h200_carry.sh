#!/usr/bin/env bash
# On the CPU machine: make what tools/h200_wheel_check.sh needs on the GPU machine, in .dev/h200/
# (ignored by git, so it travels only as a `carry` path):
#   clone/  a fresh clone of the committed HEAD on which README's setup has run here
#           (tools/dev.py setup: the in-place CUDA build), less its .venv and build/ (machine-bound)
#   wheel/  the release wheel built from that clone (tools/build_wheel.sh: auditwheel, twine)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.dev/h200
rm -rf "$dest" && mkdir -p "$dest/wheel"
git clone -q . "$dest/clone"
cd "$dest/clone"
echo "clone of $(git log --oneline -1)"
python3 tools/dev.py setup
PYTHON="$(python3 tools/dev.py which)" bash tools/build_wheel.sh ../wheel
rm -rf .venv build dist
cd ..
du -sh clone wheel
