"""The static kernel model, without a GPU: the Triton attention kernels (launches from backbones.triton_plan)
compiled for sm_90 / sm_80, their SASS read and counted per loop, a predicted time (``make kernel-report``).

report.py (the report and its command line), compiler.py (compile and cache a launch), sass.py / sass_loops.py /
loop_trips.py (the SASS, its loops and their trip counts), cost_model.py (cycles), flash_yardstick.py
(FlashAttention-2 in Triton: the yardstick), threshold_passes.py (measured threshold passes, interpreter or GPU).
"""
