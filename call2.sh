source benchmarks/gpu_env.sh
python -m pytest -q -p no:cacheprovider -o addopts=--import-mode=importlib -m gpu tests/runtime/test_w4a16_gemm_cuda.py -x 2>&1 | tail -2
cd benchmarks && python sweep_w4a16_gemm.py --ms 16 17 32 64 128 --variants ctas=3 ctas=2 stages=4 stages=2 warps=8 ctas=4 2>&1 | tee $OUT/sweep2.txt
