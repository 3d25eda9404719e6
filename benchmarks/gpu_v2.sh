#!/usr/bin/env bash
# One device call of the v2 work: bash benchmarks/gpu_v2.sh tests|bench|network (on the GPU machine, repo root).
# tests: the GPU test subset and the zoo conformance check; bench: continuous-time, shaped and recurrent
# benchmarks; network: the network benchmark and the DDP/FSDP example on one GPU (NCCL, world size 1).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} FLEXSN_DSL_CACHE=${FLEXSN_DSL_CACHE:-/tmp/flexsn-cache}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0], torch.cuda.get_device_name())"
run() { local name=$1 limit=$2; shift 2; echo "== $name: $*"; timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log" | tail -40; }
case "${1:-tests}" in
tests)
  files=$(ls tests/test_triton.py tests/test_powers.py tests/test_security.py tests/test_runtime_inputs.py \
          tests/test_shaped.py tests/test_continuous.py tests/test_recurrent.py tests/test_module.py 2>/dev/null)
  run pytest 330 python3 -m pytest -q -p no:cacheprovider $files
  run check 150 python3 benchmarks/gpu_check.py --steps 1 8 --neurons 100003 ;;
bench)
  for b in ct_bench shaped_bench recurrent_bench; do
    [ -f benchmarks/$b.py ] && run $b 180 python3 benchmarks/$b.py
  done ;;
network)
  run network 330 python3 benchmarks/network.py --rounds 3 --json "$OUT/network.json"
  spec=neurons/plif.yaml; [ -f neurons/plif_channel.yaml ] && spec=neurons/plif_channel.yaml
  run ddp 200 bash -c "torchrun --standalone --nproc_per_node 1 examples/ddp.py --check &&
    torchrun --standalone --nproc_per_node 1 examples/ddp.py --engine ddp --steps 20 --profile &&
    torchrun --standalone --nproc_per_node 1 examples/ddp.py --engine fsdp --neuron $spec --check &&
    torchrun --standalone --nproc_per_node 1 examples/ddp.py --engine fsdp --neuron $spec --steps 20 &&
    torchrun --standalone --nproc_per_node 1 examples/ddp.py --engine ddp --compile --steps 20" ;;
esac
