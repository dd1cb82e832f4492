#!/usr/bin/env bash
# The accelerator figures, in one command on a machine with an NVIDIA GPU (docs/accelerator.md):
#
#   bash benchmarks/gpu.sh [OUT_DIR]          # default OUT_DIR: benchmarks/results/gpu
#
# It records the machine, then runs `feedrate transfer` (copy bandwidth, pinning against reuse),
# `feedrate tune` of the images example with a simulated consumer (--rate 600) and with a real
# CUDA training step (benchmarks/cuda_step.py), `feedrate tune` of the large-batch pipeline (12 MiB
# batches, where pinning matters most), `feedrate doctor` of the images example with the CUDA
# step (the consumer timed alone), `benchmarks/pin_probe.py --feedrate` (where a batch's time
# goes, pinned and not: plain torch against feedrate's own loop), and the CUDA tests (with a
# two-rank job whose training group is NCCL). Each part has its own time limit, 990 s in all at
# worst; on an H200 the parts took 2.5 minutes before the probe and the NCCL job were added,
# which should add about 2 (to fit a 10-minute call, leave FEEDRATE_GPU_ALL_TESTS unset).
# The images example gets 4096 images here (FEEDRATE_EXAMPLE_IMAGES, 128 batches an epoch): at
# its default 512 an epoch is 16 batches, and 16 workers on a 16-CPU machine each make one batch
# and then wait for the next epoch. FEEDRATE_GPU_ALL_TESTS=1 adds the whole suite, 8 at a time
# with pytest-xdist, for at most 280 s more. PYTHON picks the interpreter (default: .venv's if
# present, else python3); feedrate runs from src/ (an absolute path, so the tests' subprocesses
# find it too) whether or not it is installed.
set -u
OUT=${1:-benchmarks/results/gpu}
mkdir -p "$OUT"
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-150}
LOG="$OUT/log.txt"
: > "$LOG"

part() {  # part SECONDS NAME COMMAND...: run one part under its limit, its output in the log
    local limit=$1 name=$2
    shift 2
    echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" | tee -a "$LOG"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$LOG"
}

{
    date -u +"%Y-%m-%d %H:%M:%S UTC"
    echo "commit: ${FEEDRATE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max \
        --format=csv 2>&1 || echo "nvidia-smi: not available"
    "$PYTHON" - <<'EOF'
import os, platform, sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda)
print("cpus", os.cpu_count(), "| usable", len(os.sched_getaffinity(0)), "|", platform.platform())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, "|", round(p.total_memory / 2**30, 1), "GiB |", p.multi_processor_count, "SMs")
else:
    print("gpu: none (torch.cuda.is_available() is False)")
EOF
} 2>&1 | tee "$OUT/machine.txt" | tee -a "$LOG"

F=("$PYTHON" -m feedrate)
IMAGES=(env "FEEDRATE_EXAMPLE_IMAGES=${FEEDRATE_EXAMPLE_IMAGES:-4096}" "${F[@]}")
part 90 transfer "${F[@]}" transfer --json "$OUT/transfer.json"
part 120 tune-images-rate "${IMAGES[@]}" tune examples/images.py:loader --rate 600 --fresh \
    --json "$OUT/tune-images-rate600.json"
part 120 tune-images-step "${IMAGES[@]}" tune examples/images.py:loader \
    --step benchmarks/cuda_step.py:step --fresh --json "$OUT/tune-images-step.json" \
    --plot "$OUT/tune-images-step.png"
part 120 tune-large "${F[@]}" tune benchmarks/pipelines.py:large --fresh \
    --json "$OUT/tune-large.json"
part 90 doctor-images-step "${IMAGES[@]}" doctor examples/images.py:loader \
    --step benchmarks/cuda_step.py:step --json "$OUT/doctor-images-step.json"
part 150 pin-probe "$PYTHON" benchmarks/pin_probe.py --feedrate --json "$OUT/pin-probe.json"
part 300 cuda-tests "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_transfer.py \
    tests/test_machine.py tests/test_config.py tests/test_checks.py tests/test_cache.py \
    tests/test_doctor.py tests/test_nccl.py
if [ -n "${FEEDRATE_GPU_ALL_TESTS:-}" ]; then  # the whole suite beside a GPU, 8 at a time
    # -v names each test as it ends, so a run cut at its limit still says which failed.
    part 280 all-tests "$PYTHON" -m pytest -v -p no:cacheprovider -p no:benchmark -n 8 \
        --timeout 60 -rfE tests
fi
echo "done: $OUT" | tee -a "$LOG"
