"""Analyses of patch features: PCA maps, attention statistics, patch-token norms, Patch Score / Point-in-Box,
LOST-style object discovery (CorLoc), and the cross-variant comparison report.

Submodules are independent and import nothing heavy at package import time, so
``from analysis.pca import pca_rgb`` stays cheap (the pretraining module uses it for TensorBoard).
"""
