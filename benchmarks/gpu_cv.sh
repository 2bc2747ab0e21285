#!/usr/bin/env bash
# The control-variate kernel on one GPU (issue 58, item 4), one process each, cold (no compile cache):
#   1. anchors.py: SGLD(model, control_variates=True) on the logistic regression, N rows × D = 50 held on
#      the device, against the float64 Laplace reference; compile, warmup + centre and sampling apart;
#   2. cv_scan_baseline.py: the same algorithm written by hand (lax.scan), timed beside the kernel;
#   3. out_of_core.py: the same kernel with X and y as memory-mapped .npy files read in place.
# Logs go to the folder $1 (default: the current one).
#     bash benchmarks/gpu_cv.sh /tmp/gpu_logs            # N = 10⁷ (N=... to change it)
set -uo pipefail
out=$(realpath "${1:-.}")
n=${N:-10000000}
py=${PYTHON:-python3}
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
"$py" -c "import jax, numpyro; print('jax', jax.__version__, '| numpyro', numpyro.__version__, '|', jax.devices())"
nvidia-smi -L 2>/dev/null || true
timeout 240 "$py" anchors.py --n "$n" --methods SGLD-CV --doc "$out/anchors_gpu_$n.md" 2>&1 | tee "$out/anchors.log"
timeout 150 "$py" cv_scan_baseline.py --n "$n" 2>&1 | tee "$out/cv_scan.log"
timeout 180 "$py" out_of_core.py --n "$n" --d 50 --dir "/tmp/ooc_$n" --kernels SGLD-CV --repeats 1 2>&1 | tee "$out/out_of_core.log"
