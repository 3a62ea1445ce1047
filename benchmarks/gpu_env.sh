# Source on the GPU machine: makes `import kvpilot.*` work without installing (its image has no network):
# each component folder is a source root holding kvpilot/<component>/ (kvpilot is a namespace package).
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH=$_root/cli:$_root/runtime:$_root/contracts:$_root/operator:$_root/gateway${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Wheels the GPU image lacks (pydantic for the planner, fastapi/uvicorn/pyzmq/msgspec for the server):
# benchmarks/fetch_gpu_wheels.sh fills the git-ignored .whl/, which the device call carries.
if compgen -G "$_root/.whl/*.whl" > /dev/null; then
  [ -d /tmp/site/pydantic ] || python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$_root"/.whl/*.whl
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
