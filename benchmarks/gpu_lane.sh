#!/usr/bin/env bash
# The GPU lane: the whole test suite on a CUDA machine, with Triton's real compiler (not its
# interpreter), plus the tests that only a GPU runs (test_cuda_graph.py, the cuda-parametrised
# ones, the compiled-kernel launch tests). Tests that need two GPUs skip with that reason on one.
#
# Usage, from the repo root on a machine with a CUDA GPU, torch and Triton installed:
#   bash benchmarks/gpu_lane.sh [PYTEST ARGS...]
# Wheels in .whl/ (nir, nirtorch, snntorch: the NIR peers) are installed to a private folder
# first, for machines that reach no package index. With pytest-xdist installed, the suite runs
# in $WORKERS processes (default 8; WORKERS=0 runs it in one). The log goes to $OUT/gpu-lane.log
# (default /tmp/gpu-lane) and the last line is pytest's count; the exit status is pytest's. Each failure
# is also written to $OUT/gpu-lane-failures.log as it happens (benchmarks/lane_failures.py).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TRITON_INTERPRET
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/flexsn-lane-site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/flexsn-lane-site || exit 1
fi
OUT=${OUT:-/tmp/gpu-lane}; mkdir -p "$OUT"
python3 - <<'PY' || exit 1
import sys, torch, triton
if not torch.cuda.is_available():
    sys.exit("gpu_lane.sh: no CUDA GPU here; the CPU suite is `python -m pytest -q`")
print(f"torch {torch.__version__}, triton {triton.__version__}, python {sys.version.split()[0]}, "
      f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()} (write the commit you ran beside the counts)")
PY
workers=()
if [ "${WORKERS:-8}" != 0 ] && python3 -c "import xdist" 2>/dev/null; then workers=(-n "${WORKERS:-8}"); fi
python3 -m pytest -q -rfEs -p no:cacheprovider -p benchmarks.lane_failures "${workers[@]}" tests plugins "$@" 2>&1 | tee "$OUT/gpu-lane.log"
