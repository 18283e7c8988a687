#!/usr/bin/env bash
# vLLM 0.26.0 for a GPU machine without internet: its wheel and exactly the dependency
# wheels that machine lacks, packed into parts of at most 58 MiB (DIR/p1 .. DIR/pN).
#
#   bash scripts/vllm_wheels.sh DIR            # run where pip reaches PyPI
#   KEEP_FA2=1 bash scripts/vllm_wheels.sh DIR # keep FlashAttention 2's kernels (+129.5 MB)
#
# The dependencies are resolved from the wheels' METADATA (scripts/vllm_wheels.py says
# which are left out and why); DIR/wheels.txt lists every wheel, its size and who asked
# for it; DIR/SHA256SUMS checks the parts.
#
# On the GPU machine (Python 3.12, torch 2.11.0+cu130), with p1..pN and SHA256SUMS copied
# to $PARTS: `bash scripts/vllm_install_parts.sh $PARTS /tmp/site`, which does
#   (cd $PARTS && sha256sum -c SHA256SUMS)
#   cat $(ls $PARTS/p[0-9]* | sort -V) > /tmp/vllm_wheels.tar    # p1, p2, ... p10 in order
#   mkdir -p /tmp/vllm_wheels && tar -xf /tmp/vllm_wheels.tar -C /tmp/vllm_wheels
#   pip install --no-index --no-deps --no-compile --target /tmp/site /tmp/vllm_wheels/wheels/*.whl
#   export PYTHONPATH=/tmp/site:$PYTHONPATH VLLM_ENABLE_V1_MULTIPROCESSING=0
#   python -c "import vllm, vllm._C, vllm.vllm_flash_attn; print(vllm.__version__)"
# (--target keeps the machine's own torch, numpy, numba and CUDA libraries: none of them
# is in the parts.)
set -euo pipefail
DIR="${1:?usage: bash scripts/vllm_wheels.sh DIR}"
PART_MIB="${PART_MIB:-58}"
VLLM_VERSION="${VLLM_VERSION:-0.26.0}"
cd "$(dirname "$0")/.."
mkdir -p "$DIR"
extra=()
[ "${KEEP_FA2:-0}" = 1 ] && extra+=(--keep-fa2)
python3 scripts/vllm_wheels.py "$DIR" --vllm "$VLLM_VERSION" "${extra[@]}"
rm -f "$DIR"/p[0-9]* "$DIR/wheels.tar"
(cd "$DIR" && tar -cf wheels.tar wheels wheels.txt)
split -b "${PART_MIB}M" -d -a 3 "$DIR/wheels.tar" "$DIR/part."
n=0
for f in $(ls "$DIR"/part.* | sort); do  # part.000 -> p1, part.001 -> p2, ...
  n=$((n + 1))
  mv "$f" "$DIR/p$n"
done
rm -f "$DIR/wheels.tar"
(cd "$DIR" && sha256sum $(ls p* | sort -V) > SHA256SUMS)
total=$(cat "$DIR"/p* | wc -c)
echo "$n parts of at most $PART_MIB MiB in $DIR, $((total / 1048576)) MiB in all"
ls -l "$DIR"/p*
