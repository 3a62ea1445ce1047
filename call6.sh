source benchmarks/gpu_env.sh
python -m pytest -q -p no:cacheprovider -o addopts=--import-mode=importlib -m gpu tests/runtime/test_w4a16_gemm_cuda.py 2>&1 | tail -1
cd benchmarks
python sweep_w4a16_gemm.py --ms 9 16 32 64 128 --variants ctas=2.2 2>&1 | tee $OUT/sweep6.txt
python probe_w4a16_gemm.py --ms 64 --parts base nowait noreduce nowait+noreduce nomma 2>&1 | tee $OUT/probe6.txt
