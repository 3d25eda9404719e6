#!/usr/bin/env bash
# The standard GPU benchmark session: the zoo conformance check and the BENCHMARKS.md table, and on request
# the per-feature benchmarks and the network benchmark. Each command runs under a time limit (timeout).
#
# Usage, from the repo root on a machine with a CUDA GPU, torch and Triton installed:
#   bash benchmarks/gpu_session.sh [MODE ...]      # default: check table (about 6 minutes on an H200)
# Modes:
#   check    benchmarks/gpu_check.py: every zoo spec, Triton against torch on CUDA
#   table    the BENCHMARKS.md table: `flexsn-dsl bench` rows of LIF, ALIF and Izhikevich with the peers, and
#            first calls
#   specs    benchmarks/ct_bench.py, shaped_bench.py and recurrent_bench.py
#   network  benchmarks/network.py (3 rounds) and examples/ddp.py (DDP/FSDP, one process, NCCL)
#   long     issue 27: `flexsn-dsl bench --long`, the time-parallel scan (scan_bench.py), HH with --recompute, and
#            the Open Neuromorphic workload with its peers (open_neuromorphic.py)
#   v4       issues 40 and 42: plasticity_bench.py (fused vs torch, STDPLearner), examples/song_abbott.py,
#            delay_bench.py --kernels (dense against event kernels per input density), delay_bench.py at the default event threshold, then with active hidden layers (--gain 24) at the
#            default threshold, dense only and events only, its --profile and --memory (about 8 minutes on an H100;
#            .whl/ with dcls, spikingjelly and loguru)
# Results go to $OUT (default benchmarks/results) as DEVICE-WHAT-YYYY-MM-DD[-LABEL].{log,json}, WHAT one of
# conformance, bench, ct, shaped, recurrent, network, ddp, long, scan, on, plasticity, delays; DEVICE defaults to the GPU's model (h200), LABEL
# (e.g. LABEL=before) is empty unless set. Wheels in .whl/ (SpikingJelly, snnTorch: the peers) are installed
# to a private folder first, for machines that reach no package index (for `long`, also the Open Neuromorphic
# peers: sinabs with pbr, rockpool, spikingjelly with loguru).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export FLEXSN_DSL_CACHE=${FLEXSN_DSL_CACHE:-/tmp/flexsn-cache}
unset TRITON_INTERPRET
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/flexsn-session-site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/flexsn-session-site || exit 1
fi
header=$(python3 - <<'PY'
import re, sys, torch, triton
if not torch.cuda.is_available():
    sys.exit("gpu_session.sh: no CUDA GPU here; on a CPU run the benchmarks' --quick options (benchmarks/README.md)")
name = torch.cuda.get_device_name()
model = next((w.lower() for w in re.split(r"[^A-Za-z0-9]+", name) if re.search(r"\d", w)), "gpu")
print(model, f"torch {torch.__version__} triton {triton.__version__} python {sys.version.split()[0]} {name}")
PY
) || exit 1
DEVICE=${DEVICE:-${header%% *}}
header=${header#* }
echo "$header"
OUT=${OUT:-benchmarks/results}; mkdir -p "$OUT"
stem() { echo "$OUT/$DEVICE-$1-$(date +%F)${LABEL:+-$LABEL}"; }  # stem WHAT: the result file without suffix

# run WHAT SECONDS CMD...: CMD's output appended to WHAT's log (the versions first in a new log); the bench
# table's log leaves out warnings, as the logs in benchmarks/results do
failed=()
run() {
  local what=$1 limit=$2 log; shift 2; log=$(stem "$what").log
  [ -s "$log" ] || echo "$header" > "$log"
  echo "== $*" >&2
  timeout "$limit" "$@" 2>&1 \
    | if [ "$what" = bench ]; then grep --line-buffered -v "Warning\|warn\|^ \|^$" || true; else cat; fi \
    | tee -a "$log" || failed+=("$*")
}

table() {
  local B=(python3 -m flexsn_dsl bench --json "$(stem bench).json")
  run bench 120 "${B[@]}" neurons/lif.yaml -T 64 -n 1048576 --mode training --dtype bfloat16 --peers spikingjelly
  run bench 150 "${B[@]}" neurons/lif.yaml -T 8 -n 4194304 --mode training --dtype bfloat16 --peers compile spikingjelly
  run bench 150 "${B[@]}" neurons/alif.yaml neurons/izhikevich.yaml -T 8 -n 4194304 --mode training \
    --peers torch compile
  run bench 90 "${B[@]}" neurons/lif.yaml -T 1024 -n 65536 --mode training --peers torch spikingjelly
  run bench 240 "${B[@]}" neurons/lif.yaml -T 8 -n 4194304 --peers torch compile spikingjelly
  run bench 90 "${B[@]}" neurons/lif.yaml -T 64 -n 1048576 --mode training --peers torch spikingjelly
  run bench 150 "${B[@]}" neurons/lif.yaml -T 8 64 1024 -n 65536 --mode training --peers --first-call
}

network() {
  run network 330 python3 benchmarks/network.py --rounds 3 --json "$(stem network).json"
  local ddp=(torchrun --standalone --nproc_per_node 1 examples/ddp.py) plif=neurons/plif_channel.yaml
  run ddp 90 "${ddp[@]}" --check
  run ddp 90 "${ddp[@]}" --engine ddp --steps 20 --profile
  run ddp 90 "${ddp[@]}" --engine fsdp --neuron $plif --check
  run ddp 90 "${ddp[@]}" --engine fsdp --neuron $plif --steps 20
  run ddp 150 "${ddp[@]}" --engine ddp --compile --steps 20
}

long() {
  local B=(python3 -m flexsn_dsl bench --json "$(stem long).json")
  run long 300 "${B[@]}" neurons/lif.yaml --long --peers minimal spikingjelly
  run long 120 "${B[@]}" neurons/hh.yaml -T 1024 -n 1048576 --mode training --peers minimal --recompute
  run scan 300 python3 benchmarks/scan_bench.py --profile
  run on 400 python3 benchmarks/open_neuromorphic.py -n 512 4096 16384 --json "$(stem on).json"
}

v4() {
  run plasticity 120 python3 benchmarks/plasticity_bench.py --n 4096 --repeat 200 --steps 10000
  run plasticity 60 python3 examples/song_abbott.py --seconds 100
  local D=(python3 benchmarks/delay_bench.py --repeat 2)
  run delays 150 "${D[@]}" --kernels --max-delays 64                # dense against event kernels, per density
  run delays 120 "${D[@]}"                                     # the default threshold, hidden layers silent
  run delays 120 "${D[@]}" --gain 24 --max-delays 64 512         # hidden layers active (about 5 % and 20 %)
  run delays 120 "${D[@]}" --gain 24 --max-delays 64 512 --event-density 0  # dense only
  run delays 120 "${D[@]}" --gain 24 --max-delays 64 512 --event-density 1  # events only
  run delays 90 python3 benchmarks/delay_bench.py --profile --max-delays 64 --gain 24
  run delays 90 python3 benchmarks/delay_bench.py --memory --max-delays 64       # what is live at the peak
}

modes=("$@"); [ ${#modes[@]} -gt 0 ] || modes=(check table)
for m in "${modes[@]}"; do
  case "$m" in
    check|table|specs|network|long|v4) ;;
    *) echo "gpu_session.sh: unknown mode '$m' (check, table, specs, network, long, v4)" >&2; exit 2 ;;
  esac
done
for m in "${modes[@]}"; do
  case "$m" in
    check) run conformance 150 python3 benchmarks/gpu_check.py --steps 1 8 --neurons 100003 ;;
    table) table ;;
    specs)
      for b in ct shaped recurrent; do run $b 180 python3 benchmarks/${b}_bench.py --json "$(stem $b).json"; done ;;
    network) network ;;
    long) long ;;
    v4) v4 ;;
  esac
done
if [ ${#failed[@]} -gt 0 ]; then printf 'failed or timed out: %s\n' "${failed[@]}" >&2; exit 1; fi
