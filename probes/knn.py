"""The weighted k-NN of DINO's ``eval_knn.py`` lives in ``tokenmix/knn.py`` (pretraining's k-NN check uses it
too); re-exported here for ``probes.run``."""
from tokenmix.knn import DEFAULT_KS, knn_classify, knn_scores, knn_top1, knn_top1_topk

__all__ = ["DEFAULT_KS", "knn_classify", "knn_scores", "knn_top1", "knn_top1_topk"]
