"""Head-free dense probes: Hummingbird retrieval and overclustering, matched to classes."""
