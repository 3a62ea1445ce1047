source benchmarks/gpu_env.sh
cd benchmarks
python sweep_w4a16_gemm.py --ms 1 4 8 --variants ctas=2.2 ctas=3 2>&1 | tee $OUT/sweep11.txt
