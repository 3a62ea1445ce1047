source benchmarks/gpu_env.sh
cd benchmarks
python sweep_w4a16_gemm.py --ms 16 32 64 --variants ctas=3 slices=4 slices=6 slices=8 ctas=4 2>&1 | tee $OUT/sweep5.txt
