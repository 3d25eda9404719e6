#!/usr/bin/env bash
# A/B on one machine: the same command run in several copies of the repository (other commits), one after
# another, ROUNDS times with the order reversed each round, each line of output prefixed with its copy's
# name; so that two commits are timed on the same GPU in the same minutes (a GPU's clocks and neighbours
# drift between sessions).
#
# Usage, from the repo root:
#   bash benchmarks/ab.sh [--rounds N] TREE [TREE ...] -- COMMAND [ARGS ...]
# TREE: a folder holding a copy of the repository, `.` for this one. Make them here before carrying them to
# a GPU machine (.ab/ is ignored by git; name it in `carry`):
#   for rev in c55b1cd next-tile-stages-2; do
#     mkdir -p .ab/$rev && git archive $rev | tar -x -C .ab/$rev && git rev-parse --short $rev > .ab/$rev/.commit
#   done
#   bash benchmarks/ab.sh .ab/c55b1cd . -- python3 -m flexsn_dsl bench neurons/lif.yaml --long --peers minimal
# COMMAND runs in each TREE with that tree first on PYTHONPATH and its own kernel cache; paths in it are
# the tree's own. The exit status is 1 if any run failed.
set -uo pipefail
rounds=1
if [ "${1:-}" = --rounds ]; then rounds=$2; shift 2; fi
trees=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do trees+=("$1"); shift; done
if [ "${1:-}" != -- ] || [ $# -lt 2 ] || [ ${#trees[@]} -lt 1 ]; then
  echo "usage: bash benchmarks/ab.sh [--rounds N] TREE [TREE ...] -- COMMAND [ARGS ...]" >&2; exit 2
fi
shift
for tree in "${trees[@]}"; do
  [ -f "$tree/flexsn_dsl/__init__.py" ] || { echo "ab.sh: $tree holds no copy of the repository" >&2; exit 2; }
done
unset TRITON_INTERPRET
export PYTHONUNBUFFERED=1
status=0
for ((round = 0; round < rounds; round++)); do
  order=("${trees[@]}")
  if ((round % 2)); then order=(); for ((k = ${#trees[@]} - 1; k >= 0; k--)); do order+=("${trees[k]}"); done; fi
  for tree in "${order[@]}"; do
    label=$(basename "$(cd "$tree" && pwd)")
    if [ "$(git -C "$tree" rev-parse --show-toplevel 2>/dev/null)" = "$(cd "$tree" && pwd)" ]; then
      commit=$(git -C "$tree" rev-parse --short HEAD)$(git -C "$tree" diff --quiet HEAD 2>/dev/null || echo +changes)
    else
      commit=$(cat "$tree/.commit" 2>/dev/null || echo "commit unknown")
    fi
    echo "== $label ($commit), round $((round + 1)): $*"
    (cd "$tree" && FLEXSN_DSL_CACHE=/tmp/flexsn-ab-cache-$label PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} "$@") 2>&1 \
      | sed -u "s|^|$label  |" || status=1
  done
done
exit $status
