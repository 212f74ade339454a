"""facebookresearch/dino (7c446df) ``eval_copy_detection.py``, transcribed: ``CopydaysDataset`` (blocks, the
"strong" positives by file-name prefix, ``eval_result``), ``score_ap_from_ranks_1`` (Holidays' AP),
``is_image_file``, the feature step of ``extract_features`` ([CLS] + GeM(p=4) of the patch tokens, images resized
to imsize x imsize bicubic), the whitening of its ``__main__`` (mean of the whitening set, ``utils.PCA`` with
``whit=0.5`` on the uncentred whitening covariance) and its search (L2-normalise, cosine, top 20).

Deviations that change no number: ``eval_result`` returns {block: mAP} besides printing it; ``extract_features``
runs over a list of image paths in batches without the process all-gather and takes ``imsize`` instead of
``args``; ``interpolation=3`` is ``InterpolationMode.BICUBIC`` (the same; torchvision no longer takes the int);
``whiten`` and ``search`` are the ``__main__`` steps as functions; ``PCA.apply`` keeps only its CPU torch branch
(the GPU one computes the same); ``train_pca`` prints nothing. Nothing here imports the project.
"""
from __future__ import annotations

import os

import numpy as np
import torch
from PIL import Image
from torch import nn
from torchvision import transforms as pth_transforms


class CopydaysDataset():
    def __init__(self, basedir):
        self.basedir = basedir
        self.block_names = (
            ['original', 'strong'] +
            ['jpegqual/%d' % i for i in
             [3, 5, 8, 10, 15, 20, 30, 50, 75]] +
            ['crops/%d' % i for i in
             [10, 15, 20, 30, 40, 50, 60, 70, 80]])
        self.nblocks = len(self.block_names)

        self.query_blocks = range(self.nblocks)
        self.q_block_sizes = np.ones(self.nblocks, dtype=int) * 157
        self.q_block_sizes[1] = 229
        # search only among originals
        self.database_blocks = [0]

    def get_block(self, i):
        dirname = self.basedir + '/' + self.block_names[i]
        fnames = [dirname + '/' + fname
                  for fname in sorted(os.listdir(dirname))
                  if fname.endswith('.jpg')]
        return fnames

    def get_block_filenames(self, subdir_name):
        dirname = self.basedir + '/' + subdir_name
        return [fname
                for fname in sorted(os.listdir(dirname))
                if fname.endswith('.jpg')]

    def eval_result(self, ids, distances):
        maps = {}
        j0 = 0
        for i in range(self.nblocks):
            j1 = j0 + self.q_block_sizes[i]
            block_name = self.block_names[i]
            I = ids[j0:j1]   # block size  # noqa: E741
            sum_AP = 0
            if block_name != 'strong':
                # 1:1 mapping of files to names
                positives_per_query = [[i] for i in range(j1 - j0)]
            else:
                originals = self.get_block_filenames('original')
                strongs = self.get_block_filenames('strong')

                # check if prefixes match
                positives_per_query = [
                    [j for j, bname in enumerate(originals)
                     if bname[:4] == qname[:4]]
                    for qname in strongs]

            for qno, Iline in enumerate(I):
                positives = positives_per_query[qno]
                ranks = []
                for rank, bno in enumerate(Iline):
                    if bno in positives:
                        ranks.append(rank)
                sum_AP += score_ap_from_ranks_1(ranks, len(positives))

            print("eval on %s mAP=%.3f" % (
                block_name, sum_AP / (j1 - j0)))
            maps[block_name] = sum_AP / (j1 - j0)
            j0 = j1
        return maps


# from the Holidays evaluation package
def score_ap_from_ranks_1(ranks, nres):
    """ Compute the average precision of one search.
    ranks = ordered list of ranks of true positives
    nres  = total number of positives in dataset
    """

    # accumulate trapezoids in PR-plot
    ap = 0.0

    # All have an x-size of:
    recall_step = 1.0 / nres

    for ntp, rank in enumerate(ranks):

        # y-size on left side of trapezoid:
        # ntp = nb of true positives so far
        # rank = nb of retrieved items so far
        if rank == 0:
            precision_0 = 1.0
        else:
            precision_0 = ntp / float(rank)

        # y-size on right side of trapezoid:
        # ntp and rank are increased by one
        precision_1 = (ntp + 1) / float(rank + 1)

        ap += (precision_1 + precision_0) * recall_step / 2.0

    return ap


def is_image_file(s):
    ext = s.split(".")[-1]
    if ext in ['jpg', 'jpeg', 'png', 'ppm', 'bmp', 'pgm', 'tif', 'tiff', 'webp']:
        return True
    return False


def transform(imsize):
    return pth_transforms.Compose([
        pth_transforms.Resize((imsize, imsize), interpolation=pth_transforms.InterpolationMode.BICUBIC),
        pth_transforms.ToTensor(),
        pth_transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ])


def load(path, imsize):
    """``ImgListDataset.__getitem__`` with ``extract_features``' transform."""
    with open(path, 'rb') as f:
        img = Image.open(f)
        img = img.convert('RGB')
    return transform(imsize)(img)


def copy_features(model, samples):
    """The per-batch step of ``extract_features``: [CLS] and GeM-pooled patch tokens, concatenated."""
    feats = model.get_intermediate_layers(samples, n=1)[0].clone()

    cls_output_token = feats[:, 0, :]  # [CLS] token
    # GeM with exponent 4 for output patch tokens
    b, h, w, d = len(samples), int(samples.shape[-2] / model.patch_embed.patch_size), int(samples.shape[-1] / model.patch_embed.patch_size), feats.shape[-1]  # noqa: E501
    feats = feats[:, 1:, :].reshape(b, h, w, d)
    feats = feats.clamp(min=1e-6).permute(0, 3, 1, 2)
    feats = nn.functional.avg_pool2d(feats.pow(4), (h, w)).pow(1. / 4).reshape(b, -1)
    # concatenate [CLS] token and GeM pooled patch tokens
    feats = torch.cat((cls_output_token, feats), dim=1)
    return feats


@torch.no_grad()
def extract_features(image_list, model, imsize, batch_size=16):
    features = []
    for i in range(0, len(image_list), batch_size):
        samples = torch.stack([load(p, imsize) for p in image_list[i:i + batch_size]])
        features.append(copy_features(model, samples))
    return torch.cat(features)


class PCA():
    """
    Class to  compute and apply PCA.
    """
    def __init__(self, dim=256, whit=0.5):
        self.dim = dim
        self.whit = whit
        self.mean = None

    def train_pca(self, cov):
        """
        Takes a covariance matrix (np.ndarray) as input.
        """
        d, v = np.linalg.eigh(cov)
        eps = d.max() * 1e-5
        n_0 = (d < eps).sum()
        if n_0 > 0:
            d[d < eps] = eps

        # sort eigenvectors with eigenvalues order
        idx = np.argsort(d)[::-1][:self.dim]
        d = d[idx]
        v = v[:, idx]

        # for the whitening
        d = np.diag(1. / d**self.whit)

        # principal components
        self.dvt = np.dot(d, v.T)

    def apply(self, x):
        # input if from torch, on CPU
        if self.mean is not None:
            x -= torch.FloatTensor(self.mean)
        return torch.mm(torch.FloatTensor(self.dvt), x.transpose(0, 1)).transpose(0, 1)


def whiten(database, queries, features_for_whitening):
    """The ``__main__``'s whitening block: (database, queries) centred and whitened."""
    # center
    mean_feature = torch.mean(features_for_whitening, dim=0)
    database -= mean_feature
    queries -= mean_feature
    pca = PCA(dim=database.shape[-1], whit=0.5)
    # compute covariance
    cov = torch.mm(features_for_whitening.T, features_for_whitening) / features_for_whitening.shape[0]
    pca.train_pca(cov.cpu().numpy())
    database = pca.apply(database)
    queries = pca.apply(queries)
    return database, queries


def search(database, queries):
    """The ``__main__``'s copy-detection block up to ``eval_result``: (distances, indices) of the top 20."""
    # l2 normalize the features
    database = nn.functional.normalize(database, dim=1, p=2)
    queries = nn.functional.normalize(queries, dim=1, p=2)

    # similarity
    similarity = torch.mm(queries, database.T)
    distances, indices = similarity.topk(20, largest=True, sorted=True)
    return distances, indices
