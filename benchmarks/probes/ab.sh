#!/usr/bin/env bash
# A/B in one device call: the working version of a file, its previous version, the working one
# again, each in its own process (new, old, new: the spread between the two "new" runs is the noise).
#   bash benchmarks/probes/ab.sh ops/dsa/x.py benchmarks/probes/x_old.py "probes/sfa_forms:200:--tag=TAG"
# TAG in the spec becomes new1 / old / new2.
set -u
file=$1; old=$2; spec=$3
keep=$(mktemp); cp "$file" "$keep"
for tag in new1 old new2; do
  if [ "$tag" = old ]; then cp "$old" "$file"; else cp "$keep" "$file"; fi
  bash benchmarks/gpu_run.sh "${spec//TAG/$tag}" | tail -4
done
cp "$keep" "$file"
