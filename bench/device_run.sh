#!/usr/bin/env bash
# Every GPU figure of the "GPU never waits on JPEG" work in one command, <= 10 minutes on a 16-core
# H100/H200, from the repository root of a working tree that carries wheels/ (bench/prepare_wheels.sh):
#
#   bash bench/device_run.sh                 # figures and the trace under $OUT (default /tmp/shardkit-gpu)
#   WINDOW=20 SWEEP_SECONDS=4 bash bench/device_run.sh   # the defaults; shorter for a rehearsal
#
# 1. installs shardkit's missing dependencies and nvImageCodec (the one matching torch's CUDA) from
#    wheels/ into a folder of their own (torch and the system's packages are left as they are);
# 2. runs the one GPU test (nvImageCodec's backend against PIL) and prints the decode path;
# 3. bench/gpu_bench.py sections W (D whole windows: default, cuda, nvjpeg), P (profiler trace and
#    per-step breakdown, meter vs profiler), N (C nvjpeg beside a step), K (build_pool_bench at all
#    cores), S (workers x threads x pin sweep, printed config by config); gpu_bench.json is
#    rewritten after each section, so a run cut short keeps what it measured.
set -u
PY=${PY:-python3}  # the device's python3 (torch, torchvision, pyarrow, pillow)
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/shardkit-gpu}
DEPS=${DEPS:-/tmp/shardkit-deps}
mkdir -p "$OUT"
START=$(date +%s)
nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
CU=$("$PY" -c "import torch; print((torch.version.cuda or '12').split('.')[0])")
"$PY" -m pip install --quiet --disable-pip-version-check --no-index --find-links wheels --target "$DEPS" \
  dask distributed click fsspec tqdm psutil xxhash pytest 2>&1 | tail -3
if [ "$CU" = 13 ]; then NVJPEG="nvidia-nvjpeg>=13,<14"; else NVJPEG="nvidia-nvjpeg-cu12"; fi
"$PY" -m pip install --quiet --disable-pip-version-check --no-index --find-links wheels --target "$DEPS" \
  --no-deps "nvidia-nvimgcodec-cu$CU" "$NVJPEG" 2>&1 | tail -3 || echo "no nvidia-nvimgcodec-cu$CU wheel in wheels/"
export PYTHONPATH="$PWD:$DEPS"
# libnvjpeg from its wheel (nvidia/cu13/lib or nvidia/nvjpeg/lib), for nvImageCodec's GPU decoders
export LD_LIBRARY_PATH="$(ls -d "$DEPS"/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}"
"$PY" - <<'PY'
import torch
from shardkit.loader import gpu_decode, memory
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
gpu_decode.choose("auto")
print("decode='auto' takes:", memory.PATHS["decode"])
PY
timeout 60 "$PY" -m pytest -q -p no:cacheprovider "tests/test_decode_ahead.py::test_nvimgcodec_backend_runs_on_a_gpu" \
  2>&1 | tail -3
LEFT=$((590 - ($(date +%s) - START)))
timeout "$LEFT" "$PY" bench/gpu_bench.py --sections "${SECTIONS:-wpnks}" --out "$OUT" \
  --window "${WINDOW:-20}" --sweep-seconds "${SWEEP_SECONDS:-4}" ${EXTRA:-} 2>&1 | grep -v "^USDT" | tee "$OUT/gpu_bench.log"
echo "device_run.sh: $(( $(date +%s) - START )) s; figures in $OUT/gpu_bench.json, trace $OUT/trace_d_cpu.json.gz (chrome://tracing, Perfetto)"
