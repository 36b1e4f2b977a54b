#!/usr/bin/env bash
# Fill wheels/ (gitignored; it travels with the working tree to the device machine, 64 MiB at most)
# with what bench/device_run.sh installs there: the device's python3 has torch, torchvision,
# pyarrow and pillow only. Run here, before the device call:
#
#   bash bench/prepare_wheels.sh            # nvImageCodec for CUDA 13 (torch +cu13x), Python 3.10-3.13
#   NVIMGCODEC=cu12 bash bench/prepare_wheels.sh     # torch +cu12x
#   NVIMGCODEC="cu12 cu13" PYVERS=3.12 bash bench/prepare_wheels.sh   # both: ~63 MB, one Python only
#
# The last device run had torch 2.11.0+cu130 (RESULTS, "GPU figures and the 16-core build"): cu13.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/work/main/.venv/bin/python}
NVIMGCODEC=${NVIMGCODEC:-cu13}
PYVERS=${PYVERS:-"3.10 3.11 3.12 3.13"}
mkdir -p wheels
PLAT=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform linux_x86_64 --platform any)
# shardkit's run-time dependencies the device lacks (not numpy: torchvision brings it), and pytest
# for the one GPU test (tests/test_decode_ahead.py::test_nvimgcodec_backend_runs_on_a_gpu).
DEPS=("dask[distributed]>=2024.1" "click>=8.1" "fsspec>=2025.3.2" "tqdm>=4.60" "psutil>=5.9" "xxhash>=3.0"
      "pytest>=7")
for v in $PYVERS; do
  "$PY" -m pip download --quiet --only-binary=:all: --python-version "$v" "${PLAT[@]}" -d wheels "${DEPS[@]}" \
    2>&1 | grep -v "^WARNING: Location" || true
done
rm -f wheels/numpy-*.whl  # a dependency of nothing above but pulled by the resolver now and then
# nvImageCodec and the nvJPEG library its GPU decoders load (its [nvjpeg] extra; torch does not bring it)
for cu in $NVIMGCODEC; do
  if [ "$cu" = cu13 ]; then nvjpeg="nvidia-nvjpeg>=13,<14"; else nvjpeg="nvidia-nvjpeg-cu12"; fi
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 "${PLAT[@]}" -d wheels \
    "nvidia-nvimgcodec-$cu" "$nvjpeg" 2>&1 | grep -v "^WARNING: Location" || true
done
total=$(du -cb wheels/*.whl | tail -1 | cut -f1)
echo "wheels/: $(ls wheels/*.whl | wc -l) wheels, $((total / 1048576)) MiB"
if [ "$total" -gt $((64 * 1048576)) ]; then
  echo "wheels/ is over the 64 MiB a device call carries: fewer PYVERS or one NVIMGCODEC" >&2
  exit 1
fi
