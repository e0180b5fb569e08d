#!/usr/bin/env bash
# One device call for several benchmarks: install k31dsl (+ the carried wheels in .whl: lark,
# fla-core, einops) without network, then run each named benchmark with its own time limit,
# logging to $OUT and copying benchmarks/results/ there.
#   bash benchmarks/gpu_run.sh "kda:240:--no-variants,--shapes=8192x96 dsa:200 attnres:120"
# (name:limit[:args], the args comma-separated; a list inside one argument uses "+":
#  kda:300:--shapes=T8192_H96+T32768_H12)
set -uo pipefail
OUT=${OUT:-/tmp/k31out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > "$OUT/install.log" 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 K31_CACHE_DIR=/tmp/k31cache TRITON_INTERPRET=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$OUT/install.log" 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
for spec in ${1:-}; do
  IFS=: read -r name limit args <<< "$spec"
  echo "=== $name (limit ${limit}s) $(date +%T)"
  log="$OUT/${name//\//_}.log"                       # probes/x -> probes_x.log
  timeout "$limit" python3 "benchmarks/$name.py" ${args//,/ } > "$log" 2>&1
  echo "rc=$? $(date +%T)"; grep -v Warning "$log" | tail -25
done
tar czf "$OUT/results.tgz" benchmarks/results   # one file: the device tool returns only a few
exit 0
