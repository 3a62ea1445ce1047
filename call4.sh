source benchmarks/gpu_env.sh
python -m pytest -q -p no:cacheprovider -o addopts=--import-mode=importlib -m gpu tests/runtime/test_w4a16_gemm_cuda.py tests/runtime/test_w4a16_mma.py tests/runtime/test_quant_kernels.py tests/runtime/test_w4a16_cuda.py tests/runtime/test_quant_checkpoints.py tests/runtime/test_quant_load_time.py 2>&1 | tail -4
cd benchmarks
python sweep_w4a16_gemm.py --ms 9 16 32 64 128 --variants ctas=3 tt=4 ctas=2,tt=4 ctas=2 2>&1 | tee $OUT/sweep4.txt
