#!/usr/bin/env bash
# Variants of the decode loop (src/qkv/_native/decode.hpp) built side by side from this checkout
# and timed interleaved in one process against a plain read of the same K+V bytes: for choices that
# depend on the CPU (software prefetch distance, the prefetch target L1 / L2 that dispatch.cpp picks
# per CPU, the AVX2 against the AVX-512 unit), without Python or a rebuild of the module. x86-64
# with AVX-512 only. Each variant runs with each prefetch target (name/l1, name/l2). Builds in a
# temporary directory; arguments go to the driver (benchmarks/decode_ab/driver.cpp: -H -G -D -q
# -n -t -k -T -r -i -p).
#   benchmarks/decode_ab.sh -H 8 -G 8 -D 64 -n 32768 -t bf16          # MHA decode, 2 threads
#   MINSTAT=1 benchmarks/decode_ab.sh -H 32 -G 8 -D 128 -n 8192 -t bf16 -k i8 -T 1
# VARIANTS="name:flags ..." replaces the default set (flags comma-separated; A5 / A2 stand for the
# AVX-512 / AVX2 units' -m flags). Another tree's decode.hpp against this one's:
#   VARIANTS="old:A5,-iquote/tmp/old/src/qkv/_native cur:A5" benchmarks/decode_ab.sh ...
# (-iquote: the sources' own #include "..." look there first; -I would come after this tree's.)
set -euo pipefail
cd "$(dirname "$0")/.."
SRC="$PWD/src/qkv/_native"
HERE="$PWD/benchmarks/decode_ab"
# DECODE_AB_OUT=dir builds there and keeps it (run dir/decode_ab again without rebuilding)
OUT="${DECODE_AB_OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
[ -n "${DECODE_AB_OUT:-}" ] || trap 'rm -rf "$OUT"' EXIT
VARIANTS="${VARIANTS:-avx512:A5 avx2:A2 avx512_nopf:A5,-DQKV_DECODE_PREFETCH=0 avx512_pf32:A5,-DQKV_DECODE_PREFETCH=32 avx512_pf128:A5,-DQKV_DECODE_PREFETCH=128}"
A5="-mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma -mf16c"
A2="-mavx2 -mfma -mf16c -DAVX2_UNIT"
F=(-std=c++17 -O3 -I"$SRC" -I"$OUT" -Wno-unused-function -Wno-unused-parameter)
# kernels_avx2.cpp's vector types without its QKV_NS and table, for the AVX2 variants
sed -e '/^#define QKV_NS avx2/d' -e '/^namespace qkv_native {$/,$ { /extern const KernelTable kTableAvx2/,$ d }' \
  "$SRC/kernels_avx2.cpp" | sed '$ { /^namespace qkv_native {$/d }' > "$OUT/avx2_unit.inc"
objs=()
# one compiler at a time (a shared machine); CXX="ccache g++" reuses earlier builds
CXX="${CXX:-g++}"
$CXX "${F[@]}" -c "$SRC/dispatch.cpp" -o "$OUT/dispatch.o"
$CXX "${F[@]}" -c "$HERE/driver.cpp" -o "$OUT/driver.o"
for v in $VARIANTS; do
  name="${v%%:*}"
  flags="${v#*:}"
  flags="${flags//,/ }"
  flags="${flags//A5/$A5}"
  flags="${flags//A2/$A2}"
  # shellcheck disable=SC2086
  $CXX "${F[@]}" -DQKV_NS="$name" $flags -c "$HERE/variant.cpp" -o "$OUT/v_$name.o"
  objs+=("$OUT/v_$name.o")
done
$CXX "$OUT/dispatch.o" "$OUT/driver.o" "${objs[@]}" -o "$OUT/decode_ab" -pthread
echo "$(lscpu | sed -n 's/^Model name: *//p'), $(uptime | sed 's/.*load/load/')"
"$OUT/decode_ab" "$@"
