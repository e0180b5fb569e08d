#!/usr/bin/env bash
# A/B in one device call: the working versions of some files, their previous versions, the working
# ones again, each in its own process (new, old, new: the spread between the two "new" runs is the
# noise). Make the old copies before the call (they travel as untracked files), e.g.
#   git show HEAD~1:targets/triton/emit.py > /tmp/x && cp /tmp/x benchmarks/probes/emit_old.py
#   bash benchmarks/probes/ab.sh "probes/sfa_forms:200:--tag=TAG" ops/dsa/x.py benchmarks/probes/x_old.py [FILE OLD ...]
# TAG in the gpu_run.sh spec becomes new1 / old / new2.
set -u
spec=$1; shift
files=(); olds=(); keeps=()
while [ $# -ge 2 ]; do
  files+=("$1"); olds+=("$2"); keep=$(mktemp); cp "$1" "$keep"; keeps+=("$keep"); shift 2
done
for tag in new1 old new2; do
  for i in "${!files[@]}"; do
    if [ "$tag" = old ]; then cp "${olds[$i]}" "${files[$i]}"; else cp "${keeps[$i]}" "${files[$i]}"; fi
  done
  bash benchmarks/gpu_run.sh "${spec//TAG/$tag}" | tail -4
done
for i in "${!files[@]}"; do cp "${keeps[$i]}" "${files[$i]}"; done
