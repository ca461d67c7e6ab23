#!/usr/bin/env bash
# The H200 runs behind benchmarks/results/*-h200-gpu-busy.md: this branch's fast path against a baseline tree's, on
# the same harness (this tree's benchmark.py and benchmarks/), the MedGemma-4B shape with random weights.
#   benchmarks/h200_gpu_busy.sh smoke OUT            kernel checks, the GEMM table, a short benchmark of this tree
#   benchmarks/h200_gpu_busy.sh full OUT BASELINE    every row for BASELINE's src/ and this tree's, bf16 then int8
#   benchmarks/h200_gpu_busy.sh pair OUT BASELINE    the rows with targets, bf16 only (a short lease)
#   benchmarks/h200_gpu_busy.sh exactness OUT        lone, batched-overlapped and prefix-shared answers compared
# Run from this tree's root. BASELINE is the root of another checkout (its src/ is what "before" imports).
set -euo pipefail
stage=${1:?smoke, full, pair or exactness}
out=${2:?output folder}
here=$(pwd)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "${out}"
python3 -m medgemma_xray.demo_model.install --output models/medgemma-demo >/dev/null 2>&1 ||
  PYTHONPATH="${here}/src" python3 -m medgemma_xray.demo_model.install --output models/medgemma-demo >/dev/null

bench() {  # bench SRC LABEL MODES EXTRA...: the benchmark with SRC's library and this tree's harness
  local src=$1 label=$2 modes=$3
  shift 3
  PYTHONPATH="${src}:${here}" python3 "${here}/benchmark.py" --random-weights medgemma-4b --modes "${modes}" \
    --output "${out}/${label}" --answer-tokens 128 --report-tokens 128 --max-sequence 2048 "$@"
  cp "${out}/${label}/benchmark.json" "${out}/${label}.json"
  rm -rf "${out:?}/${label}"
}

case "${stage}" in
  smoke)
    python3 -m benchmarks.paged_checks --output "${out}" --skip exactness
    bench "${here}/src" smoke pytorch-fast --requests 5 --concurrency 16,48 --answers-per-user 1 --turns 5 \
      --turn-tokens 64 --films 20 --report-users 16 --teaching-students 48 --class-students 48 --busy-users 16,48
    ;;
  full | pair)
    baseline=${3:?baseline tree}
    (cd "${baseline}" && PYTHONPATH="${baseline}/src" python3 -m medgemma_xray.demo_model.install \
      --output models/medgemma-demo >/dev/null)
    rows=(--requests 5 --concurrency "1,16,48,64" --answers-per-user 2 --turns 5 --turn-tokens 64 --films 100
      --report-users 16 --teaching-students "48,96" --class-students 48 --busy-users "16,48")
    modes=(pytorch-fast pytorch-fast-int8)
    if [[ ${stage} == pair ]]; then  # bf16 alone, the rows with targets: fits a short device lease
      rows=(--requests 5 --concurrency "16,48,64" --answers-per-user 2 --turns 5 --turn-tokens 64 --films 100
        --report-users 16 --teaching-students 48 --class-students 48 --busy-users "16,48")
      modes=(pytorch-fast)
    fi
    # bf16 before and after first, then int8: a run cut short still has complete pairs. Each part runs even when
    # one before it failed; what failed says so in the log.
    for mode in "${modes[@]}"; do
      bench "${here}/src" "after-${mode}" "${mode}" "${rows[@]}" || echo "FAILED: after ${mode}" >&2
      bench "${baseline}/src" "before-${mode}" "${mode}" "${rows[@]}" || echo "FAILED: before ${mode}" >&2
      python3 -m benchmarks.gpu_busy_report "${out}/before-${mode}.json" "${out}/after-${mode}.json" \
        --output "${out}/report-${mode}.md" | tail -14 || true
    done
    ;;
  exactness)
    python3 -m benchmarks.paged_checks --output "${out}" --skip kernels,gemm --weights bf16
    ;;
  *)
    echo "unknown stage ${stage}: smoke or full" >&2
    exit 2
    ;;
esac
