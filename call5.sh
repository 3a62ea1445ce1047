source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
w2() { python -m kvpilot.runtime.bench --workloads W2 --quantization int4 2>&1 | tee -a $OUT/w2_$1.txt | grep -o '"output_tok_s": [0-9.]*' | head -1 | sed "s/^/$1 /"; }
(cd basetree && source benchmarks/gpu_env.sh && w2 base)
w2 new
(cd basetree && source benchmarks/gpu_env.sh && w2 base)
w2 new
python -m pytest -q -p no:cacheprovider -o addopts=--import-mode=importlib -m gpu tests/runtime/test_w4a16_gemm_cuda.py 2>&1 | tail -4
timeout 200 python -m pytest -q -p no:cacheprovider -o addopts=--import-mode=importlib -m gpu tests/runtime/test_no_recompile_gpu.py -k "int4 or None" 2>&1 | tail -4
