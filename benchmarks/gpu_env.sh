# Source on the GPU machine: makes `import kvpilot.*` work without installing (its image has no network),
# by building the namespace package from symlinks to the component folders.
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p /tmp/kvp/kvpilot
cp "$_root"/cli/*.py /tmp/kvp/kvpilot/
for c in runtime gateway operator; do ln -sfn "$_root/$c" "/tmp/kvp/kvpilot/$c"; done
export PYTHONPATH=/tmp/kvp${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
