#!/usr/bin/env bash
# CI: compile every CUDA source in gpu/ for sm_90a with nvcc (no GPU needed), every template
# instance the library launches, and print ptxas's register / shared-memory / spill report into
# the build log. Fails on any compiler error. Skips (exit 0, with a note) when nvcc is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null; then echo "compile_cuda: nvcc not on PATH, skipped"; exit 0; fi
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for src in gpu/*.cu; do
  name=$(basename "$src")
  for fmt in $("$PY" -c "import fp8lab; print(' '.join(fp8lab.list_formats()))"); do
    if { [ "$name" = "gemm.cu" ] || [ "$name" = "gemm_wgmma.cu" ]; } && [ "$fmt" != "e4m3" ]; then continue; fi  # format-independent
    "$PY" -m fp8lab.gpu._loader "$name" "$fmt" > "$tmp/$name"
    echo "== nvcc $name ($fmt)"
    nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -Xptxas -v -cubin \
         -o "$tmp/${name%.cu}.$fmt.cubin" "$tmp/$name" > "$tmp/log" 2>&1 || true
    grep -v "^ptxas info    : Compiling entry\|^ptxas info    : Function properties" "$tmp/log" || true
    if [ ! -s "$tmp/${name%.cu}.$fmt.cubin" ]; then echo "compile_cuda: FAILED $name ($fmt)"; status=1; fi
    # ptxas serializing wgmma (C7514/C7515...) silently costs the overlap the kernels are built for
    if grep -q "Potential Performance Loss: wgmma" "$tmp/log"; then
      echo "compile_cuda: FAILED $name ($fmt): ptxas serialized wgmma instructions"; status=1
    fi
  done
done
exit $status
