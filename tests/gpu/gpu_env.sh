# tests/gpu/gpu_env.sh - what the GPU scripts do first, sourced from the repository root:
#   . tests/gpu/gpu_env.sh
# Everything the script prints goes to the terminal and to $OUT/run.log ($OUT: the device tool's output
# folder, /tmp/mv-out by default); the Debian packages carried in .deps/ are unpacked into /opt/deps and
# their libraries put on LD_LIBRARY_PATH (for binaries built elsewhere and carried, as for those built
# here with DEPS_PREFIX=/opt/deps); MV_COMMIT is exported, empty unless given.
OUT=${OUT:-/tmp/mv-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
mkdir -p /opt/deps
for f in .deps/*.deb; do [ -f "$f" ] && dpkg -x "$f" /opt/deps; done
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MV_COMMIT=${MV_COMMIT:-}
