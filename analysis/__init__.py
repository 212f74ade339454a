"""Analyses of patch features: PCA maps, attention statistics, patch-token norms, Patch Score / Point-in-Box,
LOST-style object discovery (CorLoc), and the cross-variant comparison report.

Submodules are independent and import nothing heavy at package import time. PCA maps and attention statistics
live in ``tokenmix/`` (``tokenmix.pca``, ``tokenmix.attention_stats``), the layer pretraining imports too.
"""
