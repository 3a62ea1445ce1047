source benchmarks/gpu_env.sh
python -m pytest -q -p no:cacheprovider -o addopts=--import-mode=importlib -m gpu tests/runtime/test_w4a16_gemm_cuda.py -x 2>&1 | tail -1
cd benchmarks
python probe_w4a16_gemm.py --ms 16 64 2>&1 | tee $OUT/probe3.txt
python sweep_w4a16_gemm.py --ms 16 32 64 --variants ctas=3 stages=3 ctas=4 2>&1 | tee $OUT/sweep3.txt
