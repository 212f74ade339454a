"""google-research/rliable (commit 3ccd9f4dea577a04d3d2b557f259aac08badbd81), transcribed: the reference of the
probability of improvement in ``tokenmix.stats`` (tests/test_study_stats.py).

- ``rliable/metrics.py``: ``probability_of_improvement`` (as is: Mann-Whitney U / (n_x n_y) per task, 0.5 for
  identical score columns, averaged over tasks).
- ``rliable/library.py``: ``StratifiedIndependentBootstrap``'s resampling: every score matrix (runs x tasks) is
  resampled on its own, and within it each task's runs independently (``np.random.choice(num_runs, shape)`` then
  the task index as the second coordinate), here as one function ``stratified_independent_resample``; the
  percentile interval of ``get_interval_estimates`` (``method='percentile'``, 95 %) as ``percentile_interval``.

Deviations that change no number: the ``arch`` bootstrap classes are replaced by the two functions above (rliable
subclasses ``arch.bootstrap``, not installed here); a ``numpy.random.Generator`` instead of the global state.
Nothing here imports the project.
"""
import numpy as np
import scipy.stats


def probability_of_improvement(scores_x: np.ndarray, scores_y: np.ndarray):
    """Overall probability of improvement of algorithm X over Y: P(X_m > Y_m) averaged across tasks m.
    scores_*: (num_runs x num_tasks)."""
    num_tasks = scores_x.shape[1]
    task_improvement_probabilities = []
    num_runs_x, num_runs_y = scores_x.shape[0], scores_y.shape[0]
    for task in range(num_tasks):
        if np.array_equal(scores_x[:, task], scores_y[:, task]):
            task_improvement_prob = 0.5
        else:
            task_improvement_prob, _ = scipy.stats.mannwhitneyu(
                scores_x[:, task], scores_y[:, task], alternative='greater')
            task_improvement_prob /= (num_runs_x * num_runs_y)
        task_improvement_probabilities.append(task_improvement_prob)
    return np.mean(task_improvement_probabilities)


def stratified_independent_resample(scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One StratifiedIndependentBootstrap draw of one (num_runs x num_tasks) matrix: runs resampled per task."""
    indices = rng.choice(scores.shape[0], scores.shape, replace=True)
    return scores[indices, np.arange(scores.shape[1])[None, :]]


def percentile_interval(scores_x, scores_y, reps: int, rng: np.random.Generator, size: float = 0.95):
    """The 95 % percentile interval of the probability of improvement over ``reps`` stratified draws."""
    stats = [probability_of_improvement(stratified_independent_resample(scores_x, rng),
                                        stratified_independent_resample(scores_y, rng)) for _ in range(reps)]
    return tuple(np.percentile(stats, [50 * (1 - size), 50 * (1 + size)]))
