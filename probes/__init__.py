"""Probes on frozen tokenmix backbones: k-NN, ImageNet linear, linear segmentation, linear depth.

Entry point: ``python -m probes.run --task <task> ...`` (``make probe TASK=...``).
"""
