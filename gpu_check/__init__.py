"""``make gpu-check``: the one run on a machine with a CUDA GPU (gpu_check/check.py; parts.py: the kernel, op and
ViT rows; dino.py: the DINO step, data and demo rows). Timing and tables: bench.harness."""
