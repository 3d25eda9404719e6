#!/usr/bin/env bash
# One device call: install carried wheels, check conformance, time compilation, benchmark.
# Usage (on the GPU machine, repo root): bash benchmarks/gpu_session.sh [quick|full]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0], torch.cuda.get_device_name())"
mode=${1:-quick}
B="python3 -m flexsn_dsl bench --json $OUT/bench.json"
if [ "$mode" = quick ] || [ "$mode" = check ]; then
  python3 benchmarks/gpu_check.py --steps 1 8 --neurons 100003 2>&1 | tee "$OUT/check.log"
fi
if [ "$mode" = quick ] || [ "$mode" = perf ]; then
  $B neurons/lif.yaml -T 8 -n 4194304 --peers torch spikingjelly 2>&1 | tee -a "$OUT/bench.log"
  $B neurons/lif.yaml -T 64 -n 1048576 --peers torch spikingjelly 2>&1 | tee -a "$OUT/bench.log"
  $B neurons/lif.yaml -T 64 -n 1048576 --dtype bfloat16 --mode training --peers spikingjelly 2>&1 | tee -a "$OUT/bench.log"
  $B neurons/lif.yaml -T 8 -n 4194304 --dtype bfloat16 --mode training --peers spikingjelly 2>&1 | tee -a "$OUT/bench.log"
  $B neurons/alif.yaml neurons/izhikevich.yaml -T 8 -n 4194304 --mode training --peers torch 2>&1 | tee -a "$OUT/bench.log"
  $B neurons/lif.yaml -T 1024 -n 65536 --mode training --peers spikingjelly 2>&1 | tee -a "$OUT/bench.log"
  $B neurons/lif.yaml -T 8 64 1024 -n 65536 --mode training --peers --first-call 2>&1 | tee -a "$OUT/bench.log"
fi
