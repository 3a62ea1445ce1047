source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
python -m pytest -q -p no:cacheprovider -o addopts=--import-mode=importlib -m gpu tests/runtime/test_w4a16_gemm_cuda.py -x 2>&1 | tail -15
cd benchmarks && python sweep_w4a16_gemm.py --ms 32 64 128 --variants warps=4 warps=8 stages=4 stages=2 ctas=3 ctas=1 2>&1 | tee $OUT/sweep1.txt
