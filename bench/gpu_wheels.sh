#!/usr/bin/env bash
# Fetch the wheels bench/gpu_check.sh installs on a GPU machine that has no MPI library and no
# network: MPICH's (the mpich wheel, any Python) and mpi4py's for that machine's Python, into
# FOLDER (default .whl, which git ignores), where there is a network. Carry FOLDER with the
# repository; bench/gpu_check.sh installs from it, offline, when it finds no mpiexec.
#
# Usage: bench/gpu_wheels.sh [FOLDER]
# Environment: PYTHON (the pip to run, python3), PYTHON_VERSION (the GPU machine's Python, 3.12),
#   ARCH (x86_64; aarch64 for Arm machines), MPICH (5.0.2), MPI4PY (4.1.2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
folder=${1:-.whl}
arch=${ARCH:-x86_64}
version=${PYTHON_VERSION:-3.12}
mkdir -p "$folder"
"${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    --platform "manylinux_2_28_$arch" --platform "manylinux_2_17_$arch" --platform "manylinux2014_$arch" \
    --platform "manylinux_2_5_$arch" --platform "manylinux1_$arch" \
    -d "$folder" "mpich==${MPICH:-5.0.2}" "mpi4py==${MPI4PY:-4.1.2}"
ls "$folder"
