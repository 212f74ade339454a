"""DINO's image-level protocols in fp32 (the default, as DINO) against bf16 autocast (``make probe ARGS=--bf16`` on a
GPU), emulated on the CPU: ``inference_autocast`` made ``torch.autocast("cpu", dtype=torch.bfloat16)`` around the
backbone forward (only there, as on CUDA); the same fixtures, the same random ViT-S/16, every mAP in both
precisions and their difference.

    PYTHONPATH=. OMP_NUM_THREADS=1 python -m bench.precision_deviation

Fixtures: the tests' generators (tests/helpers/retrieval_fixtures.py) at a larger size: Copydays 20 originals,
30 strong copies, 50 distractors, 40 whitening images at 96 px; roxford5k 40 database images, 8 queries (x2
scale, at most 224 px, multi-scale). The backbone: ``vit_small_patch16``, random init (seed 0), its final norm
drawn unevenly (so that descriptor norms differ), as the tests' ``vit_pair``.
"""
from __future__ import annotations

import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _model():
    import backbones
    model = backbones.create_vit("vit_small_patch16", "softmax", seed=0).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.norm.weight.copy_(torch.rand(model.embed_dim, generator=g) * 2 + 0.2)
        model.norm.bias.copy_(torch.randn(model.embed_dim, generator=g))
    return model


def _copydays(root: Path, model, bf16: bool) -> dict:
    from datamodules.datasets.copydays import CopydaysDataset
    from probes.instance.copy_detection import CopyDetectionOptions, run_copy_detection
    from probes.instance.global_features import Extraction
    blocks = {b: CopydaysDataset(root, b, imsize=96) for b in ("original", "strong", "jpegqual/50", "crops/50")}
    return run_copy_detection(model, blocks, CopyDetectionOptions(imsize=96, bf16=bf16), Extraction(),
                              CopydaysDataset(root, "distractors", imsize=96),
                              CopydaysDataset(root, "whitening", imsize=96))["mAP"]


def _revisitop(root: Path, model, bf16: bool) -> dict:
    from datamodules import build_dataset
    from probes.instance.global_features import Extraction
    from probes.instance.image_retrieval import ImageRetrievalOptions, run_image_retrieval
    db, q = (build_dataset("roxford5k", root, split, imsize=224) for split in ("database", "query"))
    return run_image_retrieval(model, db, q, ImageRetrievalOptions(imsize=224, multiscale=True, bf16=bf16),
                               Extraction())["mAP"]


@contextmanager
def cpu_bf16(device, enabled: bool = True):
    """``inference_autocast`` with the CPU standing in for CUDA."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
        yield


def run(quick: bool = False) -> dict:
    sys.path.insert(0, str(REPO / "tests"))
    from helpers.retrieval_fixtures import write_copydays, write_revisitop
    from probes.instance import copy_detection, image_retrieval
    copy_detection.inference_autocast = image_retrieval.inference_autocast = cpu_bf16
    torch.manual_seed(0)
    model, rows = _model(), []
    with tempfile.TemporaryDirectory() as tmp:
        cd, ro = Path(tmp) / "copydays", Path(tmp)
        write_copydays(cd, n_orig=10 if quick else 20, n_distractors=50, n_whitening=40, seed=0)
        write_revisitop(ro, "roxford5k", n_db=20 if quick else 40, n_q=4 if quick else 8, seed=0, scale=2)
        for name, fn in (("copydays", _copydays), ("roxford5k multiscale", _revisitop)):
            fp32, bf16 = fn(cd if name == "copydays" else ro, model, False), fn(cd if name == "copydays" else ro,
                                                                                  model, True)
            for k in fp32:
                rows.append({"task": name, "block": k, "fp32": fp32[k], "bf16": bf16[k], "delta": bf16[k] - fp32[k]})
    for r in rows:
        print(f"{r['task']:22s} {r['block']:12s} fp32 {r['fp32']:8.3f}  bf16 {r['bf16']:8.3f}  delta {r['delta']:+.3f}")
    return {"rows": rows}


if __name__ == "__main__":
    run("--quick" in sys.argv)
