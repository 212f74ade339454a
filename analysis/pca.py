"""PCA maps of patch features live in ``tokenmix/pca.py`` (pretraining's TensorBoard images use them too);
re-exported here for the analyses."""
from tokenmix.pca import foreground_mask, pca_fit, pca_rgb

__all__ = ["foreground_mask", "pca_fit", "pca_rgb"]
