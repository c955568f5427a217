#!/usr/bin/env bash
# Run an experiment's Python script against the package as it was at the commit its folder is pinned to.
#
#   experiments/run.sh experiments/<folder>/<script>.py [arguments...]
#
# A script that takes the package apart (the model, the masking, a stage's outputs) imports its internals, which move
# as the package moves; so the script is not run against the package of today but against the one it was written
# for: the commit in the `COMMIT` file of its folder (or of the nearest folder above it, up to experiments/). This is
# the folder's requirement: that commit's package, with the dependencies of that commit's pyproject.toml and
# constraints.txt (PYTHON=<interpreter> to use an environment made for them; default: the project's .venv).
#
# The commit is checked out once, as a detached worktree of this repository under
# ${FOURM_KFP_TREES:-$HOME/.cache/fourm-kfp/trees}/<commit>, and put first on PYTHONPATH; the script itself runs from
# here (this tree's copy, which tests/test_architecture.py keeps equal to the commit's), from the repository root, so
# relative paths such as runs/demo mean what the folder's README says.
set -euo pipefail

if [[ $# -lt 1 || ! -f $1 ]]; then
  echo "usage: experiments/run.sh experiments/<folder>/<script>.py [arguments...]" >&2
  exit 2
fi
script=$(realpath "$1")
shift
repo=$(git -C "$(dirname "$script")" rev-parse --show-toplevel)
experiments=$repo/experiments

folder=$(dirname "$script")
while [[ ! -f $folder/COMMIT && $folder != "$experiments" && $folder != / ]]; do
  folder=$(dirname "$folder")
done
if [[ ! -f $folder/COMMIT ]]; then
  echo "experiments/run.sh: no COMMIT file for $script (in its folder or above it, up to experiments/)" >&2
  exit 2
fi
commit=$(grep -v '^#' "$folder/COMMIT" | head -n 1 | tr -d '[:space:]')
if ! git -C "$repo" cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "experiments/run.sh: commit $commit (from $folder/COMMIT) is not in this clone: git fetch --unshallow" >&2
  exit 2
fi

tree=${FOURM_KFP_TREES:-$HOME/.cache/fourm-kfp/trees}/$commit
if [[ ! -d $tree/src/fourm_kfp ]]; then
  mkdir -p "$(dirname "$tree")"
  git -C "$repo" worktree add --detach "$tree" "$commit" >&2
fi

cd "$repo"
PYTHONPATH=$tree/src${PYTHONPATH:+:$PYTHONPATH} exec "${PYTHON:-$repo/.venv/bin/python}" "$script" "$@"
