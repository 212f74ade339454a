"""Image retrieval on revisited Oxford and Paris, transcribed from two projects:

- filipradenovic/revisitop (be39832) ``python/evaluate.py``: ``compute_ap``, ``compute_map``;
  ``python/dataset.py``: ``configdataset`` (the roxford5k / rparis6k branch), ``config_imname``,
  ``config_qimname``; ``python/example_evaluate.py``: the Easy / Medium / Hard ground truth built from each
  query's easy / hard / junk lists (``protocol_gnd``: the three loops of the script, one per protocol);
  ``python/example_process_images.py``: ``pil_loader`` and the query crop ``.crop(cfg['gnd'][i]['bbx'])``
  (``load_query``).
- facebookresearch/dino (7c446df) ``eval_image_retrieval.py``: ``OxfordParisDataset.__getitem__`` (``dino_image``:
  RGB, ``thumbnail((imsize, imsize))``, ToTensor + ImageNet Normalize), the feature step of ``eval_knn.py``'s
  ``extract_features`` (``model(samples)``: the last block's normalised [CLS]; ``utils.multi_scale`` with
  ``multiscale=True``) and the ranking of its ``__main__`` (``dino_ranks``: L2-normalise, ``train @ query.T``,
  ``argsort(-sim, dim=0)``). DINO's dataset does not crop queries by their box; revisitop's protocol does
  (``load_query``).

Deviations that change no number: ``np.in1d`` (removed in NumPy 2.4) is ``np.isin``, identical on 1-D arrays;
``Image.ANTIALIAS`` (removed in Pillow 10) is ``Image.LANCZOS``, the same filter; ``dino_image`` takes a path or
a PIL image instead of an index into a list; the extraction runs one image at a time without the process
all-gather. Nothing here imports the project.
"""
from __future__ import annotations

import os
import pickle

import numpy as np
import torch
from PIL import Image, ImageFile
from torch import nn
from torchvision import transforms as pth_transforms


# ------------------------------------------------------------------ revisitop python/evaluate.py

def compute_ap(ranks, nres):
    """Average precision from the zero-based ranks of the positive images (``nres`` positives in all)."""
    # number of images ranked by the system
    nimgranks = len(ranks)

    # accumulate trapezoids in PR-plot
    ap = 0

    recall_step = 1. / nres

    for j in np.arange(nimgranks):
        rank = ranks[j]

        if rank == 0:
            precision_0 = 1.
        else:
            precision_0 = float(j) / rank

        precision_1 = float(j + 1) / (rank + 1)

        ap += (precision_0 + precision_1) * recall_step / 2.

    return ap


def compute_map(ranks, gnd, kappas=[]):
    """(map, aps, pr, prs) for ``ranks`` (db_size x #queries, zero-based) and ``gnd`` (per query 'ok', 'junk');
    a query without positives is left out of the mean."""
    map = 0.
    nq = len(gnd)  # number of queries
    aps = np.zeros(nq)
    pr = np.zeros(len(kappas))
    prs = np.zeros((nq, len(kappas)))
    nempty = 0

    for i in np.arange(nq):
        qgnd = np.array(gnd[i]['ok'])

        # no positive images, skip from the average
        if qgnd.shape[0] == 0:
            aps[i] = float('nan')
            prs[i, :] = float('nan')
            nempty += 1
            continue

        try:
            qgndj = np.array(gnd[i]['junk'])
        except:  # noqa: E722 (as the reference)
            qgndj = np.empty(0)

        # sorted positions of positive and junk images (0 based)
        pos = np.arange(ranks.shape[0])[np.isin(ranks[:, i], qgnd)]
        junk = np.arange(ranks.shape[0])[np.isin(ranks[:, i], qgndj)]

        k = 0
        ij = 0
        if len(junk):
            # decrease positions of positives based on the number of
            # junk images appearing before them
            ip = 0
            while (ip < len(pos)):
                while (ij < len(junk) and pos[ip] > junk[ij]):
                    k += 1
                    ij += 1
                pos[ip] = pos[ip] - k
                ip += 1

        # compute ap
        ap = compute_ap(pos, len(qgnd))
        map = map + ap
        aps[i] = ap

        # compute precision @ k
        pos += 1  # get it to 1-based
        for j in np.arange(len(kappas)):
            kq = min(max(pos), kappas[j])
            prs[i, j] = (pos <= kq).sum() / kq
        pr = pr + prs[i, :]

    map = map / (nq - nempty)
    pr = pr / (nq - nempty)

    return map, aps, pr, prs


# ------------------------------------------------------------------ revisitop python/example_evaluate.py

def protocol_gnd(gnd, protocol):
    """The ground truth of one protocol as example_evaluate.py builds it: 'easy' (E), 'medium' (M), 'hard' (H)."""
    gnd_t = []
    for i in range(len(gnd)):
        g = {}
        if protocol == 'easy':
            g['ok'] = np.concatenate([gnd[i]['easy']])
            g['junk'] = np.concatenate([gnd[i]['junk'], gnd[i]['hard']])
        elif protocol == 'medium':
            g['ok'] = np.concatenate([gnd[i]['easy'], gnd[i]['hard']])
            g['junk'] = np.concatenate([gnd[i]['junk']])
        else:
            g['ok'] = np.concatenate([gnd[i]['hard']])
            g['junk'] = np.concatenate([gnd[i]['junk'], gnd[i]['easy']])
        gnd_t.append(g)
    return gnd_t


# ------------------------------------------------------------------ revisitop python/dataset.py

def configdataset(dataset, dir_main):
    dataset = dataset.lower()

    if dataset not in ['roxford5k', 'rparis6k']:
        raise ValueError('Unknown dataset: {}!'.format(dataset))

    # loading imlist, qimlist, and gnd, in cfg as a dict
    gnd_fname = os.path.join(dir_main, dataset, 'gnd_{}.pkl'.format(dataset))
    with open(gnd_fname, 'rb') as f:
        cfg = pickle.load(f)
    cfg['gnd_fname'] = gnd_fname
    cfg['ext'] = '.jpg'
    cfg['qext'] = '.jpg'

    cfg['dir_data'] = os.path.join(dir_main, dataset)
    cfg['dir_images'] = os.path.join(cfg['dir_data'], 'jpg')

    cfg['n'] = len(cfg['imlist'])
    cfg['nq'] = len(cfg['qimlist'])

    cfg['im_fname'] = config_imname
    cfg['qim_fname'] = config_qimname

    cfg['dataset'] = dataset

    return cfg


def config_imname(cfg, i):
    return os.path.join(cfg['dir_images'], cfg['imlist'][i] + cfg['ext'])


def config_qimname(cfg, i):
    return os.path.join(cfg['dir_images'], cfg['qimlist'][i] + cfg['qext'])


# ------------------------------------------------------------------ revisitop python/example_process_images.py

def pil_loader(path):
    # to avoid crashing for truncated (corrupted images)
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    # open path as file to avoid ResourceWarning
    # (https://github.com/python-pillow/Pillow/issues/835)
    with open(path, 'rb') as f:
        img = Image.open(f)
        return img.convert('RGB')


def load_query(cfg, i):
    """Query ``i`` cropped by its bounding box, as the protocol requires before any processing."""
    return pil_loader(cfg['qim_fname'](cfg, i)).crop(cfg['gnd'][i]['bbx'])


# ------------------------------------------------------------------ DINO eval_image_retrieval.py / eval_knn.py

TRANSFORM = pth_transforms.Compose([
    pth_transforms.ToTensor(),
    pth_transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
])


def dino_image(img, imsize=None, transform=TRANSFORM):
    """``OxfordParisDataset.__getitem__`` after the open: a path (opened as DINO does) or a PIL image."""
    if not isinstance(img, Image.Image):
        ImageFile.LOAD_TRUNCATED_IMAGES = True
        with open(img, 'rb') as f:
            img = Image.open(f)
            img = img.convert('RGB')
    if imsize is not None:
        img.thumbnail((imsize, imsize), Image.LANCZOS)
    if transform is not None:
        img = transform(img)
    return img


def multi_scale(samples, model):
    """DINO utils.multi_scale: the mean over scales 1, 1/sqrt(2), 1/2 (bilinear), divided by its norm."""
    v = None
    for s in [1, 1/2**(1/2), 1/2]:  # we use 3 different scales
        if s == 1:
            inp = samples.clone()
        else:
            inp = nn.functional.interpolate(samples, scale_factor=s, mode='bilinear', align_corners=False)
        feats = model(inp).clone()
        if v is None:
            v = feats
        else:
            v += feats
    v /= 3
    v /= v.norm()
    return v


@torch.no_grad()
def extract_features(model, images, multiscale=False):
    """eval_knn.extract_features' feature step over a list of (1, 3, H, W) tensors: one row per image."""
    features = None
    for index, samples in enumerate(images):
        if multiscale:
            feats = multi_scale(samples, model)
        else:
            feats = model(samples).clone()
        if features is None:
            features = torch.zeros(len(images), feats.shape[-1])
        features[index] = feats[0]
    return features


def dino_ranks(train_features, query_features):
    """eval_image_retrieval's Step 1 (normalise) and Step 2 (similarity, ranks: db_size x #queries)."""
    train_features = nn.functional.normalize(train_features, dim=1, p=2)
    query_features = nn.functional.normalize(query_features, dim=1, p=2)
    sim = torch.mm(train_features, query_features.T)
    ranks = torch.argsort(-sim, dim=0).cpu().numpy()
    return ranks
