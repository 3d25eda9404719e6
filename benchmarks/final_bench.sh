#!/usr/bin/env bash
# The BENCHMARKS.md table in one device call (H200). Results: $OUT/bench.json, $OUT/bench.log.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
B="python3 -m flexsn_dsl bench --json $OUT/bench.json"
run() { "$@" 2>&1 | grep -v "Warning\|warn\|^ \|^$" | tee -a "$OUT/bench.log"; }
run $B neurons/lif.yaml -T 8 -n 4194304 --peers torch compile spikingjelly
run $B neurons/lif.yaml -T 64 -n 1048576 --mode training --peers torch spikingjelly
run $B neurons/lif.yaml -T 64 -n 1048576 --mode training --dtype bfloat16 --peers spikingjelly
run $B neurons/lif.yaml -T 8 -n 4194304 --mode training --dtype bfloat16 --peers compile spikingjelly
run $B neurons/alif.yaml neurons/izhikevich.yaml -T 8 -n 4194304 --mode training --peers torch compile
run $B neurons/lif.yaml -T 1024 -n 65536 --mode training --peers spikingjelly
