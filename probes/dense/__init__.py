"""Dense probes with a head: linear segmentation, linear depth, the closed-form ridge probe; their metrics."""
