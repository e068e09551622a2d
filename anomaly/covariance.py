"""The detector's robust covariance model: a Minimum Covariance Determinant fit (scikit-learn) over
calm GPUs' features (tensor residual z, power ratio, SM-clock ratio, all relative to peers), which gives
each candidate GPU a robust Mahalanobis distance. A candidate must be an outlier in that joint space
too, not only in one column.

Its own module: the only state the detector keeps across jobs (a reservoir of calm rows and the fitted
model), and the only use of scikit-learn and scipy.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.stats import chi2
from sklearn.covariance import MinCovDet

from .state import Candidate, DetectorConfig

FEATURES = 3  # tensor residual z, log power ratio, log SM-clock ratio


class OutlierModel:
    """Learns from calm rows (:meth:`keep_calm_rows`), judges candidates (:meth:`confirm`, once a cycle)."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self.md_threshold = float(chi2.ppf(config.md_quantile, df=FEATURES))
        self.calm_rows = np.zeros((0, FEATURES))
        self.model: tuple[np.ndarray, np.ndarray] | None = None
        self.cycles = 0

    def keep_calm_rows(self, rows: np.ndarray) -> None:
        """Add the feature rows of GPUs that learnt this window (the complete ones) to the reservoir."""
        rows = rows[np.isfinite(rows).all(axis=1)]
        if len(rows):
            self.calm_rows = np.concatenate([self.calm_rows, rows])[-self.config.mcd_rows :]

    def confirm(self, candidates: list[Candidate]) -> list[np.ndarray]:
        """Per candidate job, per GPU: is the GPU an outlier of the robust covariance model?

        The model (Minimum Covariance Determinant) is fitted on rows of calm windows only (a reservoir
        over recent cycles and all jobs), so that it describes how healthy GPUs deviate from their
        peers jointly in tensor activity, power and clock; an episode's own noise never widens it.
        Until it has enough rows the z-score decides alone."""
        cfg = self.config
        self.cycles += 1
        due = self.model is None or self.cycles % cfg.mcd_refit_every == 0
        if due and len(self.calm_rows) >= cfg.mcd_min_rows:
            self._fit()
        out = []
        for candidate in candidates:
            if self.model is None:
                out.append(np.ones(candidate.z.shape, dtype=bool))
                continue
            location, inverse = self.model
            centred = candidate.features - location
            distances = np.einsum("ij,jk,ik->i", centred, inverse, centred)
            # A row with a missing feature cannot be placed: the z-score decides for it.
            distances = np.where(np.isfinite(distances), distances, np.inf)
            out.append((distances >= self.md_threshold).reshape(candidate.z.shape))
        return out

    def _fit(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = MinCovDet(random_state=self.config.seed, support_fraction=0.75).fit(self.calm_rows)
        # Ridge: a feature that is constant (clocks pinned at max) must not make every tiny
        # difference an outlier.
        covariance = model.covariance_ + np.diag([1e-2, 1e-4, 1e-4])
        self.model = (model.location_, np.linalg.inv(covariance))
