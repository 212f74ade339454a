"""``make bench`` (bench/run.py): one module per comparison, each exposing run(quick); bench/harness.py is the one
harness (timing, peak memory, the machine line, tables) that bench and gpu_check share. official_dino.py (with
dino_profile.py) is the manual comparison against a facebookresearch/dino checkout."""
