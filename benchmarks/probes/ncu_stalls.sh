#!/usr/bin/env bash
# Probe: where kernels stall, per SASS instruction (Nsight Compute PC sampling, --set full) and
# per kernel, for one or more profile_target.py targets; writes OUT/NAME_summary.txt
# (ncu_summary.py) and OUT/NAME_sass.csv. Each argument: name:kernel-regex:skip:count:target
#   OUT=/tmp/out bash benchmarks/probes/ncu_stalls.sh "sfa:sfa_scores|sfa_values:2:2:sfa_two_pass"
# (the DSA step at B=64 L=32K: "step:lightning|topk_segments:3:3:dsa_step")
set -uo pipefail
OUT=${OUT:-/tmp/k31out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /tmp/install.log 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 K31_CACHE_DIR=/tmp/k31cache TRITON_INTERPRET=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >> /tmp/install.log 2>&1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for spec in "$@"; do
  IFS=: read -r name regex skip count target <<< "$spec"
  rep=/tmp/$name.ncu-rep
  timeout 300 "$NCU" --clock-control none --set full --import-source no -k "regex:$regex" --launch-skip "$skip" \
      --launch-count "$count" -f -o "$rep" python3 benchmarks/probes/profile_target.py "$target" > "/tmp/$name.log" 2>&1
  echo "$name rc=$?"; tail -2 "/tmp/$name.log"
  "$NCU" -i "$rep" --page source --print-source sass --csv > "$OUT/${name}_sass.csv" 2>&1
  "$NCU" -i "$rep" --page details > "/tmp/${name}_details.txt" 2>&1
  grep -E "^  [a-z_]+_kernel|Duration|Registers Per|Theoretical Occ|Dynamic Shared" "/tmp/${name}_details.txt" > "$OUT/${name}_summary.txt"
  python3 benchmarks/probes/ncu_summary.py "$OUT/${name}_sass.csv" 30 >> "$OUT/${name}_summary.txt"
done
exit 0
