source benchmarks/gpu_env.sh
python -m pytest -q -p no:cacheprovider -o addopts=--import-mode=importlib -m gpu tests/runtime/test_w4a16_gemm_cuda.py -k wgmma 2>&1 | tail -3
cd benchmarks
python sweep_w4a16_gemm.py --ms 32 64 128 --variants ctas=2.2 wg=1 wg=1,ctas=3 wg=1,stages=4 2>&1 | tee $OUT/sweep7.txt
