"""facebookresearch/dino (7c446df) ``eval_knn.py``, transcribed: ``knn_classifier``, the weighted k-NN vote on
L2-normalised features (cosine similarity, the top ``k`` train neighbours each voting exp(sim / T) for its class).

Deviation that changes no number: the test images are scored in one chunk instead of 100 (each row's vote is
independent of the others). Nothing here imports the project.
"""
from __future__ import annotations

import torch


@torch.no_grad()
def knn_classifier(train_features, train_labels, test_features, test_labels, k, T, num_classes=1000):
    """(top-1 %, top-5 %) of the test images; features as the official ``extract_features`` leaves them
    (rows L2-normalised)."""
    train_features = train_features.t()
    batch_size = test_labels.shape[0]
    similarity = torch.mm(test_features, train_features)
    distances, indices = similarity.topk(k, largest=True, sorted=True)
    candidates = train_labels.view(1, -1).expand(batch_size, -1)
    retrieved_neighbors = torch.gather(candidates, 1, indices)
    retrieval_one_hot = torch.zeros(batch_size * k, num_classes, device=train_features.device)
    retrieval_one_hot.scatter_(1, retrieved_neighbors.view(-1, 1), 1)
    distances_transform = distances.clone().div_(T).exp_()
    probs = torch.sum(torch.mul(retrieval_one_hot.view(batch_size, -1, num_classes),
                                distances_transform.view(batch_size, -1, 1)), 1)
    _, predictions = probs.sort(1, True)
    correct = predictions.eq(test_labels.data.view(-1, 1))
    top1 = correct.narrow(1, 0, 1).sum().item() * 100.0 / batch_size
    top5 = correct.narrow(1, 0, min(5, k)).sum().item() * 100.0 / batch_size  # top5 does not make sense if k < 5
    return top1, top5
