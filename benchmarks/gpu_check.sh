#!/usr/bin/env bash
# Issue 34's GPU checks, in one call on a machine with an NVIDIA GPU (the device machine of a session
# runs it from the repository's root, with $OUT for what comes back; elsewhere $OUT defaults to a
# temporary folder). Each stage has its own time limit, so one that hangs still leaves the others'
# results; every stage's log goes to $OUT and a summary line per stage to $OUT/summary.txt.
#
#   bash benchmarks/gpu_check.sh
#
# Stages:
#   bench   benchmarks/gpu_bench.py: the layers beside the kernel API, eager torch, torch.compile
#           (default and reduce-overhead) and Liger-Kernel's RoPE (installed from .whl/ when there:
#           `pip download liger-kernel --no-deps -d .whl`).
#   tests   the suite's GPU tests: every layer under torch.cuda.set_sync_debug_mode("error") (the
#           vocab-parallel cases on a one-rank NCCL group), a training step captured in a CUDA graph
#           and under torch.compile(mode="reduce-overhead") with fresh dropout masks per replay, opcheck
#           on every op sample on the GPU (real vs fake strides), the Triton kernel tests compiled.
#   assert  a bad token id on CUDA fails a device-side assert (a child process: the assert poisons
#           the CUDA context), never a silent zero row.
#   nccl    the vocab-parallel demo on NCCL (world of one), checked against the one-process model.
#   tied    benchmarks/tied_loss_bench.py --backend cuda: the tied loss beside the eager logits path and
#           Liger-Kernel's fused linear cross-entropy, time and peak memory (issue 33's GPU row).
#   hosttable  benchmarks/gpu_bench.py --cases host_table: tables kept in host memory (storage="host") with
#           prefetch against the same tables on the device, per layer type (issue 51's GPU row), and
#           tests/torch/test_host_storage.py's real-CUDA test (pinned copies on a side stream, no sync in forward).
#   tiles   (experiment, not by default) tile sizes of the Triton embedding and RoPE kernels.
#   host    (experiment, not by default) host time per call of each piece of a layer call, and a profile.
#   diag    (experiment, not by default) which variant of a reduce-overhead training step breaks.
#   ab      (experiment, not by default) the Triton kernels of an earlier commit against the working
#           tree's, bits and time: BEFORE=folder (`git archive REV src/tokenpos/kernels/triton | tar -x -C
#           folder`, carried with the tree).
# STAGES="bench tiles" runs only those (default: bench tests assert nccl tied hosttable); TESTS="files" narrows the
# tests stage; BENCH_LIMIT / TESTS_LIMIT change those stages' limits (seconds).
set -u
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=src:/tmp/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
fi
{ nvidia-smi -L; python3 -c "import torch, triton, numba, numpy; print('torch', torch.__version__, 'triton',
triton.__version__, 'numba', numba.__version__, 'numpy', numpy.__version__, torch.cuda.get_device_name())"; } \
    >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

stage() {                                   # stage NAME SECONDS COMMAND...
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    echo "stage $name: exit $rc after $(( $(date +%s) - start )) s (limit $limit s)" | tee -a "$OUT/summary.txt"
}

want() { [[ " ${STAGES:-bench tests assert nccl tied hosttable} " == *" $1 "* ]]; }   # STAGES="bench tiles" picks stages

want bench && stage bench "${BENCH_LIMIT:-260}" python3 benchmarks/gpu_bench.py --rounds 15 --json "$OUT/gpu_bench.json"
TESTS=${TESTS:-tests/torch/test_no_host_sync.py tests/torch/test_errors.py tests/kernels/triton tests/torch/test_ops.py}
# shellcheck disable=SC2086
want tests && stage tests "${TESTS_LIMIT:-200}" python3 -m pytest -q -p no:cacheprovider -n 8 --timeout 150 $TESTS \
    -k "cuda or triton or reduce_overhead"
want assert && stage assert 60 python3 -c '
import torch, tokenpos.torch as tpt
layer = tpt.TokenEmbedding(10, 4, device="cuda", seed=0)
try:
    y = layer(torch.tensor([1, 10], device="cuda"))      # queued; the assert fires on the device, and
    torch.cuda.synchronize()                             # torch raises at the next CUDA call or sync
except RuntimeError as exc:
    print("bad id on CUDA: RuntimeError at the next CUDA call:", str(exc).splitlines()[0])
else:
    raise SystemExit("bad id on CUDA: no error, output " + str(y.cpu()))'
want nccl && stage nccl 90 python3 -m torch.distributed.run --nproc-per-node 1 -m tokenpos.examples.vocab_parallel_lm --device cuda --steps 30 --check
want tied && stage tied 120 python3 benchmarks/tied_loss_bench.py --backend cuda --rounds 5
want hosttable && stage hosttable "${HOSTTABLE_LIMIT:-240}" bash -c "python3 benchmarks/gpu_bench.py --cases host_table \
    --rounds 10 --json '$OUT/host_table.json' && python3 -m pytest -q -p no:cacheprovider --timeout 120 \
    tests/torch/test_host_storage.py -k real_cuda"

want tiles && stage tiles 120 python3 benchmarks/experiments/exp_gpu_tiles.py
want host && stage host 60 python3 benchmarks/experiments/exp_gpu_host.py --profile "$OUT/host_profile.txt"
want diag && stage diag 90 python3 benchmarks/experiments/exp_gpu_reduce_overhead.py
want ab && stage ab 120 python3 benchmarks/experiments/exp_gpu_kernel_ab.py --before "${BEFORE:?BEFORE=folder for the ab stage}"

for f in bench tests assert nccl tied hosttable tiles host diag ab; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; tail -n 60 "$OUT/$f.log"; }; done
cat "$OUT/summary.txt"
