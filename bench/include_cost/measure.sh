#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# What including loom costs (docs/include-cost.md). For each compiler found here (g++, the newest
# clang++, that clang++ with libc++ when its headers are installed, nvcc on a .cu when CUDA is),
# compiles at -std=c++20 -O2 a translation unit that includes only the standard headers loom's
# headers name (the baseline, derived from include/loom on every run), then one per umbrella header
# (include/loom/*.hpp), and prints per row the best of N runs of CPU time (user + sys, the
# compiler's child processes included), that time as a multiple of the baseline's, the peak memory
# and the preprocessed lines.
#
#   bash bench/include_cost/measure.sh [N]            measure (N runs per row, default 5), print the table
#   bash bench/include_cost/measure.sh --record [N]   the same, and write the figures to figures.tsv
#   bash bench/include_cost/measure.sh --doc          print the table of the recorded figures.tsv
#                                                     (docs/include-cost.md's table; ctest compares them)
#   bash bench/include_cost/measure.sh --quick        compile each translation unit once, without timing,
#                                                     and check that figures.tsv covers every umbrella
#                                                     (a default ctest)
#   bash bench/include_cost/measure.sh --guard [N]    measure one compiler's rows and fail when an
#                                                     umbrella's multiple of the baseline exceeds the
#                                                     recorded one by more than 25% (ctest label bench)
#   --cxx "CMD"  the compiler command, flags allowed: the only one measured (default: every one found),
#                or the one --quick and --guard use (default g++)
set -euo pipefail
cd "$(dirname "$0")/../.."
here=bench/include_cost
figures=$here/figures.tsv
tolerance=1.25

mode=measure n=5 cxx_opt=""
while (($#)); do
  case $1 in
    --record | --doc | --quick | --guard) mode=${1#--} ;;
    --cxx) cxx_opt=$2; shift ;;
    [0-9]*) n=$1 ;;
    *) echo "measure.sh: unknown argument '$1' (see the comment at the top)" >&2; exit 2 ;;
  esac
  shift
done

# The baseline: every standard header that a loom header includes (<name> without a dot or slash;
# <mpi.h>, <cuda_runtime_api.h>, <nvtx3/...> are not standard C++).
std_headers() {
  grep -rhE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<[a-z_]+>' include/loom | sed -E 's/.*<([a-z_]+)>.*/\1/' | sort -u
}
# The umbrella headers, loom/loom.hpp first.
umbrellas() {
  echo loom/loom.hpp
  (cd include && ls loom/*.hpp) | grep -vx loom/loom.hpp
}
cuda_include=${CUDA_HOME:-/usr/local/cuda}/include
nvcc_bin=$(command -v nvcc || true)
[ -n "$nvcc_bin" ] || { [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && nvcc_bin=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc; } || true

# The compilers of the table: g++, the newest clang++ (clang++-NN or clang++), the same with libc++
# when it compiles a standard header, nvcc.
compilers() {
  command -v g++ >/dev/null && echo "g++"
  local clang
  clang=$(compgen -c clang++ | grep -E '^clang\+\+(-[0-9]+)?$' | sort -uV | tail -1 || true)
  if [ -n "$clang" ]; then
    echo "$clang"
    if echo '#include <vector>' | $clang -std=c++20 -stdlib=libc++ -x c++ -fsyntax-only - 2>/dev/null; then
      echo "$clang -stdlib=libc++"
    fi
  fi
  if [ -n "$nvcc_bin" ]; then echo "nvcc"; fi
}
version_of() {
  case $1 in
    nvcc) "$nvcc_bin" --version | sed -nE 's/.*release [0-9.]+, V([0-9.]+).*/\1/p' ;;
    *) set -- $1; $1 -dumpfullversion 2>/dev/null || $1 -dumpversion ;;
  esac
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nstd=$(std_headers | wc -l)
{ echo "// The $nstd standard headers loom's headers include (bench/include_cost/measure.sh)."
  std_headers | sed 's/.*/#include <&>/'
  echo 'int main() { return 0; }'; } > "$work/baseline.src"
# tu_file NAME EXT: the translation unit of NAME ("std" or an umbrella), as a .cpp or a .cu.
tu_file() {
  local f="$work/$(echo "$1" | tr '/.' '__').$2"
  if [ "$1" = std ]; then cp "$work/baseline.src" "$f"; else printf '#include <%s>\nint main() { return 0; }\n' "$1" > "$f"; fi
  echo "$f"
}
# command_for CXX TU [flags...]: sets cmd to the compile of TU ("std" or an umbrella) with CXX
# (a command, flags allowed) at -std=c++20 -O2; cuda.hpp gets the CUDA headers, nvcc a .cu.
command_for() {
  local cxx=$1 tu=$2; shift 2
  if [ "$cxx" = nvcc ]; then
    cmd=("$nvcc_bin" -std=c++20 -O2 -Iinclude "$@" "$(tu_file "$tu" cu)")
  else
    read -ra cmd <<< "$cxx"
    cmd+=(-std=c++20 -O2 -Iinclude)
    [ "$tu" != loom/cuda.hpp ] || cmd+=(-isystem "$cuda_include")
    cmd+=("$@" "$(tu_file "$tu" cpp)")
  fi
}
# Whether this compiler's row for TU can be built here (cuda.hpp needs the CUDA headers).
applicable() {
  [ "$2" != loom/cuda.hpp ] || [ "$1" = nvcc ] || [ -f "$cuda_include/cuda_runtime_api.h" ]
}
# measure_tu CXX TU N: prints "cpu_seconds peak_mib preprocessed_lines", the best of N runs.
measure_tu() {
  local cxx=$1 tu=$2 runs=$3 best="" mem="" u s m t
  command_for "$cxx" "$tu" -c -o "$work/o.o"
  for _ in $(seq "$runs"); do
    /usr/bin/time -f "%U %S %M" -o "$work/time" "${cmd[@]}"
    read -r u s m < "$work/time"
    t=$(awk -v u="$u" -v s="$s" 'BEGIN { printf "%.2f", u + s }')
    if [ -z "$best" ] || awk -v a="$t" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$t mem=$((m / 1024)); fi
  done
  command_for "$cxx" "$tu" -E
  echo "$best $mem $("${cmd[@]}" 2>/dev/null | wc -l)"
}

# The table, from rows "compiler<TAB>version<TAB>tu<TAB>n<TAB>cpu<TAB>mib<TAB>lines" (figures.tsv's
# format; the baseline row of a compiler comes before its umbrellas). One printer for a measurement
# and for --doc, so the document shows what the program prints.
header() {
  echo "| compiler | translation unit | CPU time (s, best of $1) | × baseline | peak memory (MiB) | preprocessed lines |"
  echo "|---|---|---|---|---|---|"
}
row() {  # compiler version tu n cpu mib lines baseline_cpu nstd
  local label ratio
  if [ "$3" = std ]; then label="baseline: the $9 standard headers loom includes"; else label="\`<$3>\`"; fi
  ratio=$(awk -v a="$5" -v b="$8" 'BEGIN { printf "%.2f", a / b }')
  printf '| `%s` %s | %s | %.2f | %s | %d | %d |\n' "$1" "$2" "$label" "$5" "$ratio" "$6" "$7"
}

recorded() { grep -v '^#' "$figures"; }  # the figures.tsv rows
if [[ $mode =~ ^(doc|quick|guard)$ ]] && [ ! -f "$figures" ]; then
  echo "measure.sh: $figures is missing: run bash $here/measure.sh --record" >&2
  exit 1
fi

case $mode in
  doc)
    rn=$(recorded | head -1 | cut -f4)
    rstd=$(sed -nE 's/^# baseline: ([0-9]+) standard headers.*/\1/p' "$figures")
    header "$rn"
    base=""
    while IFS=$'\t' read -r c v tu rn2 cpu mib lines; do
      [ "$tu" != std ] || base=$cpu
      row "$c" "$v" "$tu" "$rn2" "$cpu" "$mib" "$lines" "$base" "$rstd"
    done < <(recorded)
    ;;

  quick)
    cxx=${cxx_opt:-g++}
    fail=0
    for tu in std $(umbrellas); do
      if ! applicable "$cxx" "$tu"; then echo "skipped: $tu (no CUDA headers in $cuda_include)"; continue; fi
      command_for "$cxx" "$tu" -fsyntax-only
      if "${cmd[@]}"; then echo "compiles: $tu ($cxx)"; else echo "FAILED: $tu ($cxx)"; fail=1; fi
    done
    # The record must cover the umbrellas of today (a new one is measured before it is documented).
    want=$(umbrellas | sort)
    have=$(recorded | cut -f3 | grep -vx std | sort -u)
    if [ "$want" != "$have" ]; then
      echo "FAILED: $figures does not cover the umbrella headers of include/loom (recorded: $(echo $have); now: $(echo $want))."
      echo "        Measure again: bash $here/measure.sh --record, then copy the output of --doc into docs/include-cost.md."
      fail=1
    fi
    exit $fail
    ;;

  guard)
    cxx=${cxx_opt:-g++}
    rows=$(recorded | awk -F'\t' -v c="$cxx" '$1 == c')
    if [ -z "$rows" ]; then echo "SKIPPED: $figures has no figures for '$cxx'"; exit 0; fi
    read -r base _ _ < <(measure_tu "$cxx" std "$n")
    rbase=$(echo "$rows" | awk -F'\t' '$3 == "std" { print $5 }')
    echo "$cxx: baseline ${base} s now, ${rbase} s recorded; each umbrella's multiple of the baseline may grow by $(awk -v t=$tolerance 'BEGIN { print (t - 1) * 100 }')%"
    fail=0
    while IFS=$'\t' read -r _ _ tu _ cpu _ _; do
      [ "$tu" != std ] || continue
      read -r t _ _ < <(measure_tu "$cxx" "$tu" "$n")
      now=$(awk -v a="$t" -v b="$base" 'BEGIN { printf "%.2f", a / b }')
      was=$(awk -v a="$cpu" -v b="$rbase" 'BEGIN { printf "%.2f", a / b }')
      limit=$(awk -v w="$was" -v t=$tolerance 'BEGIN { printf "%.2f", w * t }')
      if awk -v a="$now" -v l="$limit" 'BEGIN { exit !(a > l) }'; then
        echo "FAILED: <$tu> ${t} s = ${now} x baseline, recorded ${was} x, limit ${limit} x"; fail=1
      else
        echo "ok: <$tu> ${t} s = ${now} x baseline, recorded ${was} x, limit ${limit} x"
      fi
    done <<< "$rows"
    exit $fail
    ;;

  measure | record)
    command -v /usr/bin/time >/dev/null || { echo "measure.sh: needs /usr/bin/time (Debian package time)" >&2; exit 1; }
    out="$work/figures.tsv"
    {
      echo "# recorded by: bash $here/measure.sh --record $n ($(date -u +%Y-%m-%d); $(nproc) cores; $(uname -sr))"
      echo "# baseline: $nstd standard headers: $(std_headers | tr '\n' ' ')"
      echo "# columns: compiler, version, translation unit, runs, CPU s (best), peak MiB, preprocessed lines"
    } > "$out"
    header "$n"
    if [ -n "$cxx_opt" ]; then cxxs=("$cxx_opt"); else mapfile -t cxxs < <(compilers); fi
    for cxx in "${cxxs[@]}"; do
      v=$(version_of "$cxx")
      base=""
      for tu in std $(umbrellas); do
        applicable "$cxx" "$tu" || continue
        read -r cpu mib lines < <(measure_tu "$cxx" "$tu" "$n")
        [ "$tu" != std ] || base=$cpu
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$cxx" "$v" "$tu" "$n" "$cpu" "$mib" "$lines" >> "$out"
        row "$cxx" "$v" "$tu" "$n" "$cpu" "$mib" "$lines" "$base" "$nstd"
      done
    done
    if [ "$mode" = record ]; then cp "$out" "$figures"; echo "recorded in $figures; docs/include-cost.md's table is: bash $here/measure.sh --doc"; fi
    ;;
esac
