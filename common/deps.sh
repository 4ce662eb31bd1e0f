#!/usr/bin/env bash
# common/deps.sh - make sure the Debian packages the lab builds with are here.
#
# Called by `make run` and `make test` (with --test, which adds Criterion).
# Each library is looked for by compiling a one-line #include; a missing one
# is installed with apt-get when we are root, or named in the exact command
# to run. --prefix DIR also looks under DIR (Debian packages unpacked with
# `dpkg -x`, as on the GPU machine).
set -euo pipefail

want_test=0
prefix=""
while [ $# -gt 0 ]; do
  case "$1" in
    --test) want_test=1 ;;
    --prefix) prefix="$2"; shift ;;
    *) echo "deps.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

# header  package
needs=(
  "cjson/cJSON.h libcjson-dev"
  "pcre2.h libpcre2-dev"
  "utf8proc.h libutf8proc-dev"
  "xxhash.h libxxhash-dev"
  "microhttpd.h libmicrohttpd-dev"
)
[ "$want_test" = 1 ] && needs+=("criterion/criterion.h libcriterion-dev")

cc=${CC:-cc}
command -v "$cc" >/dev/null 2>&1 || cc=gcc
missing=()
command -v "$cc" >/dev/null 2>&1 || missing+=(build-essential)
command -v make >/dev/null 2>&1 || missing+=(make)
# Open MPI is optional (the engine's --tensor-parallel-size > 1); CI asks for
# it with MV_REQUIRE_MPI=1. Its mpi.h is not on the default include path, so
# the compiler wrapper is what is looked for.
if [ "${MV_REQUIRE_MPI:-0}" = 1 ] && ! command -v mpicc >/dev/null 2>&1; then
  missing+=(openmpi-bin libopenmpi-dev)
fi
for entry in "${needs[@]}"; do
  header=${entry%% *}
  pkg=${entry##* }
  inc=()
  [ -n "$prefix" ] && inc=(-I"$prefix/usr/include")
  if ! printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <%s>\n' "$header" |
       "$cc" "${inc[@]}" -E -x c - >/dev/null 2>&1; then
    missing+=("$pkg")
  fi
done

[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing missing packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
  echo "installed: ${missing[*]}"
else
  echo "error: missing packages: ${missing[*]}" >&2
  echo "install them with:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
