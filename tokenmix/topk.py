"""Top-1 / top-5 accuracy over a validation pass, counted with torchmetrics: the supervised run's validation and
the linear probe read it the same way. ``compute`` sums the counts over processes (a collective: every rank calls
it, never rank 0 alone), then starts the next pass from zero."""
from __future__ import annotations

import torch
import torch.nn as nn
from torchmetrics.classification import MulticlassAccuracy


class TopK(nn.Module):
    def __init__(self, num_classes: int):
        super().__init__()
        self.top1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.top5 = MulticlassAccuracy(num_classes, top_k=min(5, num_classes), average="micro")

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        self.top1.update(logits, labels)
        self.top5.update(logits, labels)

    def compute(self) -> tuple[float, float]:
        """(top-1 %, top-5 %) of the pass, then reset."""
        top1, top5 = 100.0 * self.top1.compute().item(), 100.0 * self.top5.compute().item()
        self.top1.reset()
        self.top5.reset()
        return top1, top5
