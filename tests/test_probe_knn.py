"""k-NN classifier: hand-worked votes and a literal per-sample loop of DINO's eval_knn formula."""
import math

import pytest
import torch

from tokenmix.knn import knn_classify, knn_scores, knn_top1, knn_top1_topk


def _loop_reference(train, labels, test, num_classes, k, T):
    # per test sample: cosine to every train sample, k largest, weights exp(sim/T) summed per class
    preds = []
    for x in test:
        sims = [float(torch.dot(x / x.norm(), t / t.norm())) for t in train]
        order = sorted(range(len(sims)), key=lambda i: -sims[i])[:k]
        votes = [0.0] * num_classes
        for i in order:
            votes[int(labels[i])] += math.exp(sims[i] / T)
        preds.append(max(range(num_classes), key=lambda c: votes[c]))
    return torch.tensor(preds)


def test_hand_worked_weights_beat_majority():
    # one very close neighbour of class 1 outweighs two farther class-0 neighbours (T small)
    train = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [-1.0, 0.0]])
    labels = torch.tensor([1, 0, 0, 2])
    test = torch.tensor([[1.0, 0.5]])  # cos to [1,0] = 0.894, to [0,1] = 0.447
    scores = knn_scores(train, labels, test, num_classes=3, k=3, T=0.07)
    c1, c0 = math.exp(2 / math.sqrt(5) / 0.07), 2 * math.exp(1 / math.sqrt(5) / 0.07)
    assert scores[0, 1].item() == pytest.approx(c1, rel=1e-5)
    assert scores[0, 0].item() == pytest.approx(c0, rel=1e-5)
    assert scores[0, 2].item() == 0.0  # the class-2 sample is not among the 3 nearest
    assert knn_classify(train, labels, test, 3, k=3).tolist() == [1]
    # at a high temperature the weights flatten and the majority (class 0) wins
    assert knn_classify(train, labels, test, 3, k=3, T=100.0).tolist() == [0]


def test_scale_invariance_and_matches_loop():
    g = torch.Generator().manual_seed(0)
    train = torch.randn(40, 8, generator=g)
    labels = torch.randint(0, 5, (40,), generator=g)
    test = torch.randn(13, 8, generator=g)
    for k in (1, 5, 20):
        ref = _loop_reference(train, labels, test, 5, k, 0.07)
        assert torch.equal(knn_classify(train, labels, test, 5, k=k), ref)
        # cosine similarity: rescaling features changes nothing
        assert torch.equal(knn_classify(train * 7.0, labels, test * 0.01, 5, k=k), ref)


def test_top1_helper_and_k_capped():
    g = torch.Generator().manual_seed(1)
    centres = torch.randn(3, 16, generator=g) * 5
    labels = torch.arange(3).repeat_interleave(10)
    train = centres[labels] + torch.randn(30, 16, generator=g)
    test_labels = torch.tensor([0, 1, 2, 2])
    test = centres[test_labels] + torch.randn(4, 16, generator=g)
    acc = knn_top1(train, labels, test, test_labels, num_classes=3)
    assert set(acc) == {10, 20, 100, 200}
    assert acc[10] == 100.0 and acc[20] == 100.0
    # k=100 and 200 exceed the 30 training samples: capped at 30 = all samples, weighted vote still wins
    assert acc[200] == acc[100]
    both = knn_top1_topk(train, labels, test, test_labels, num_classes=3, ks=(20,))
    assert both[20]["top1"] == 100.0 and both[20]["top5"] == 100.0
    # a wrong label on one test sample gives 75 %
    assert knn_top1(train, labels, test, torch.tensor([0, 1, 2, 0]), 3, ks=(10,))[10] == 75.0


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="dims differ"):
        knn_classify(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), torch.randn(2, 5), 2)
    with pytest.raises(ValueError, match="train_labels"):
        knn_classify(torch.randn(4, 3), torch.zeros(3, dtype=torch.long), torch.randn(2, 3), 2)
