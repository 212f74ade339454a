"""The lowest layer of tokenmix, imported by pretraining, probes and analyses alike (it imports none of them):
run paths, atomic file writes, safe checkpoint loading, the mmseg shim, and the feature measures both
pretraining callbacks and evaluation use: ``knn`` (DINO's weighted k-NN), ``pca`` (PCA maps of patch
features), ``attention_stats`` (sparsity / entropy of attention maps)."""
