# Source on the GPU machine: makes `import kvpilot.*` work without installing (its image has no network):
# each component folder is a source root holding kvpilot/<component>/ (kvpilot is a namespace package).
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH=$_root/cli:$_root/runtime:$_root/contracts:$_root/operator:$_root/gateway${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
