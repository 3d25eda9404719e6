#!/usr/bin/env bash
# The BENCHMARKS.md table on the H200 (about 6 minutes; parts of about 3 minutes each):
#   bash benchmarks/final_bench.sh [all]  # both parts
#   bash benchmarks/final_bench.sh 1      # GPU conformance; bf16, ALIF/Izhikevich and T=1024 rows
#   bash benchmarks/final_bench.sh 2      # LIF float32 T=8 and T=64 with every peer; first calls
# Carry SpikingJelly's wheels in .whl/ for its peers. Results: $OUT/bench.json, $OUT/*.log.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0], torch.cuda.get_device_name())" | tee -a "$OUT/bench.log"
B="python3 -m flexsn_dsl bench --json $OUT/bench.json"
run() { timeout "$@" 2>&1 | grep -v "Warning\|warn\|^ \|^$" | tee -a "$OUT/bench.log"; }  # run SECONDS CMD...
part=${1:-all}
case "$part" in 1|all)
  timeout 150 python3 benchmarks/gpu_check.py --steps 1 8 --neurons 100003 2>&1 | tee "$OUT/check.log"
  run 120 $B neurons/lif.yaml -T 64 -n 1048576 --mode training --dtype bfloat16 --peers spikingjelly
  run 150 $B neurons/lif.yaml -T 8 -n 4194304 --mode training --dtype bfloat16 --peers compile spikingjelly
  run 150 $B neurons/alif.yaml neurons/izhikevich.yaml -T 8 -n 4194304 --mode training --peers torch compile
  run 90 $B neurons/lif.yaml -T 1024 -n 65536 --mode training --peers torch spikingjelly
  ;;
esac
case "$part" in 2|all)
  run 240 $B neurons/lif.yaml -T 8 -n 4194304 --peers torch compile spikingjelly
  run 90 $B neurons/lif.yaml -T 64 -n 1048576 --mode training --peers torch spikingjelly
  run 150 $B neurons/lif.yaml -T 8 64 1024 -n 65536 --mode training --peers --first-call
  timeout 60 python3 benchmarks/profile_call.py > "$OUT/profile.log" 2>&1  # host time of one training call
  ;;
esac
