"""PiB that cannot be gamed by a tie-break: exact ties at random (seeded), the position-aware chance level, the
most-average-patch baseline; hand-worked cases and scipy's binomial / chi-square tests."""
import pytest
import scipy.stats
import torch

from analysis.data import Sample
from analysis.tasks import Options, run_pib
from test_analysis_pib import FakeRun
from tokenmix.diffusion import (average_patch_scores, pib_hits, pick_distribution, position_chance, tied,
                                top_patch)

pytestmark = pytest.mark.timeout(60)

# 4 images on a 3 x 3 grid: box masks (row-major); coverage per position, by hand:
# corner 0: 1/4, centre 4: 4/4, patch 8: 2/4, the rest as listed
MASKS = torch.tensor([[1, 1, 0, 1, 1, 0, 0, 0, 0],
                      [0, 0, 0, 0, 1, 0, 0, 0, 0],
                      [0, 0, 0, 0, 1, 1, 0, 1, 1],
                      [0, 0, 0, 0, 1, 1, 0, 1, 1]], dtype=torch.bool)


def test_ties_are_broken_uniformly_not_at_the_first_index():
    scores = torch.tensor([[0.5, 0.9, 0.1, 0.9, 0.9]])
    assert tied(scores).tolist() == [True] and not tied(torch.tensor([[0.1, 0.2]]))[0]
    g = torch.Generator().manual_seed(1)
    picks = torch.stack([top_patch(scores, g) for _ in range(3000)]).flatten()
    counts = torch.bincount(picks, minlength=5)
    assert counts[0] == counts[2] == 0  # never a patch below the top
    assert scipy.stats.chisquare(counts[[1, 3, 4]].numpy()).pvalue > 1e-3  # 1, 3, 4 equally often
    # seeded: the same picks again
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(top_patch(scores.expand(50, 5), g1), top_patch(scores.expand(50, 5), g2))
    # a unique top is the argmax whatever the generator
    assert top_patch(torch.tensor([[0.2, 0.3, 0.1]]), g).tolist() == [1]
    torch.testing.assert_close(pick_distribution(scores), torch.tensor([[0, 1 / 3, 0, 1 / 3, 1 / 3]],
                                                                        dtype=torch.float64))


def test_all_tied_pib_equals_the_position_aware_chance_in_expectation():
    """Done-when of issue 56 item 3: every score equal -> expected PiB = the position-aware chance level, by hand
    the mean box share (4 + 1 + 4 + 4) / 36 = 13/36; the first-index rule would give 1/4 (corner 0's coverage)."""
    scores = torch.zeros(4, 9)
    chance = position_chance(pick_distribution(scores), MASKS)
    assert chance == pytest.approx(13 / 36)
    g = torch.Generator().manual_seed(0)
    n = 2000
    hits = sum(int(pib_hits(scores, MASKS, g).sum()) for _ in range(n))
    assert scipy.stats.binomtest(hits, 4 * n, 13 / 36).pvalue > 1e-3
    assert pib_hits(scores, MASKS, g).shape == (4,)
    assert MASKS[:, 0].float().mean() == 0.25  # what argmax's tie rule would score, every time


def test_position_aware_chance_hand_worked():
    # a scorer that always picks the centre: chance = coverage of the centre = 1, not the mean share 13/36
    centre = torch.zeros(4, 9)
    centre[:, 4] = 1.0
    assert position_chance(pick_distribution(centre), MASKS) == pytest.approx(1.0)
    # picks at corner 0 (images 0, 1) and patch 8 (images 2, 3): 1/2 * 1/4 + 1/2 * 2/4 = 3/8
    mixed = torch.zeros(4, 9)
    mixed[:2, 0], mixed[2:, 8] = 1.0, 1.0
    assert position_chance(pick_distribution(mixed), MASKS) == pytest.approx(3 / 8)
    # ...while that scorer's own PiB is 3/4 (it hits in image 0, 2, 3): above its chance
    assert pib_hits(mixed, MASKS).float().mean() == 0.75


def test_most_average_patch():
    patch = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])  # mean (2/3, 2/3): the third is the most average
    s = average_patch_scores(patch)
    torch.testing.assert_close(s, torch.tensor([[2 ** -0.5, 2 ** -0.5, 1.0]]))
    assert top_patch(s).tolist() == [2]


class Flat(torch.nn.Module):
    """Every patch token the same: every score ties, for [CLS] and for the most-average-patch scorer."""
    depth, patch_size, num_prefix_tokens, aggregator = 1, 8, 1, None

    def grid_size(self, x):
        return x.shape[-2] // 8, x.shape[-1] // 8

    def extract(self, x, blocks=None, votes=False, n_last_blocks=1):
        B, n = x.shape[0], (x.shape[-2] // 8) * (x.shape[-1] // 8)
        return [{"cls": torch.ones(B, 4), "patch": torch.ones(B, n, 4)}]


def test_pib_analysis_reports_ties_and_position_chance():
    g = torch.Generator().manual_seed(0)
    samples = [Sample(i, torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=g),
                      torch.tensor([[0.0, 0.0, 8.0 * (1 + i % 3), 8.0]]), str(i)) for i in range(9)]
    res = run_pib(Flat(), samples, FakeRun(), Options(crop=32, resize=32, batch_size=4, num_vis=0))
    assert res["tied_share"] == 100.0 and res["tie_seed"] == 0
    # all tied: the position-aware chance is the mean box share, 1, 2 or 3 of 16 patches: (1 + 2 + 3) / 48
    assert res["pib_chance_position"] == pytest.approx(100 * 6 / 48, abs=1e-3) == res["pib_chance"]
    assert res["patch_score_contrast_average_patch"] == 0.0 and res["pib_average_patch"] is not None
