source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
python -m pytest -q -p no:cacheprovider -o addopts=--import-mode=importlib -m gpu tests/runtime/test_w4a16_gemm_cuda.py -k "128_token or dispatch_takes" 2>&1 | tail -3
cd benchmarks
python sweep_w4a16_gemm.py --ms 129 192 256 384 512 1024 --variants stages=0 tt=16 tt=16,stages=3 tt=16,stages=4 2>&1 | tee $OUT/gemm_tt16.txt | grep "^|"
