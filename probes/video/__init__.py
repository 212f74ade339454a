"""Video: DAVIS-2017 label propagation (DINO)."""
