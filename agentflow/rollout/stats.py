"""Always-valid confidence sequences for the mean of a bounded stream (the rollout controller's sequential test).

``ConfidenceSequence`` is the predictable plug-in empirical-Bernstein confidence sequence (PrPl-EB) of
Waudby-Smith & Ramdas, "Estimating means of bounded random variables by betting" (JRSS-B 2023), Theorem 2. For
values ``x_1, x_2, ...`` in [0, 1] with a common conditional mean ``mu``,

    P( exists t >= 1 : mu not in [lower_t, upper_t] ) <= alpha

so the interval may be looked at after every sample, and a decision taken the first time it excludes a value,
without inflating the error rate (no fixed sample size, no peeking penalty). At sample ``t``:

    mu_hat_t   = (1/2 + sum_{i<=t} x_i) / (t + 1)                      (predictable mean estimate)
    sigma2_t   = (1/4 + sum_{i<=t} (x_i - mu_hat_i)^2) / (t + 1)        (predictable variance estimate)
    lambda_t   = min( sqrt(2 log(2/alpha) / (sigma2_{t-1} t log(1 + t))), C )          C = 1/2
    psi(l)     = -log(1 - l) - l
    center_t   = sum lambda_i x_i / sum lambda_i
    radius_t   = ( log(2/alpha) + sum (x_i - mu_hat_{i-1})^2 psi(lambda_i) ) / sum lambda_i
    C_t        = [center_t - radius_t, center_t + radius_t]  intersected with C_{t-1} and [0, 1]

(the paper writes the penalty as v_i psi_E(lambda_i) with v_i = 4 (x_i - mu_hat_{i-1})^2 and psi_E = psi / 4: the
same number). Its width adapts to the observed variance, which matters here: error rates near 0 and normalised
latencies near 0.05 have tiny variances, where a Hoeffding bound (variance 1/4) would need hundreds of times more
samples. The running intersection is valid because the guarantee holds for all t at once.

Every method works on Python floats and, elementwise, on numpy arrays of independent streams (the error-rate
simulation in the tests runs thousands of rollouts at once through this same code).
"""

from __future__ import annotations

import math

import numpy as np

LAMBDA_CAP = 0.5  # C in the paper (1/2 or 3/4); smaller is safer when the first samples are extreme


class ConfidenceSequence:
    """A (1 - alpha) confidence sequence for the mean of values in [0, 1] (see the module docstring).

    ``shape`` () tracks one stream; ``(R,)`` tracks R independent streams updated together (``update(x, mask)``).
    """

    def __init__(self, alpha: float, shape: tuple[int, ...] = ()):
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        self.alpha = alpha
        self.log_term = math.log(2 / alpha)
        zeros = np.zeros(shape)
        self.n = zeros.copy()  # samples seen
        self.sum_x = zeros.copy()  # sum x_i
        self.sum_sq = zeros.copy()  # sum (x_i - mu_hat_i)^2
        self.sum_lam = zeros.copy()  # sum lambda_i
        self.sum_lam_x = zeros.copy()  # sum lambda_i x_i
        self.sum_penalty = zeros.copy()  # sum (x_i - mu_hat_{i-1})^2 psi(lambda_i)
        self.lower = zeros.copy()
        self.upper = np.ones(shape)

    def update(self, x, mask=None) -> None:
        """Add one value per stream (clipped to [0, 1]); with ``mask``, only the streams where it is true."""
        x = np.clip(np.asarray(x, dtype=float), 0.0, 1.0)
        t = self.n + 1
        mu_prev = (0.5 + self.sum_x) / t  # mu_hat_{t-1}
        var_prev = (0.25 + self.sum_sq) / t  # sigma2_{t-1}
        lam = np.minimum(np.sqrt(2 * self.log_term / (var_prev * t * np.log1p(t))), LAMBDA_CAP)
        psi = -np.log1p(-lam) - lam
        new = {
            "n": t,
            "sum_x": self.sum_x + x,
            "sum_lam": self.sum_lam + lam,
            "sum_lam_x": self.sum_lam_x + lam * x,
            "sum_penalty": self.sum_penalty + (x - mu_prev) ** 2 * psi,
        }
        mu_now = (0.5 + new["sum_x"]) / (t + 1)  # mu_hat_t, includes x
        new["sum_sq"] = self.sum_sq + (x - mu_now) ** 2
        center = new["sum_lam_x"] / new["sum_lam"]
        radius = (self.log_term + new["sum_penalty"]) / new["sum_lam"]
        new["lower"] = np.maximum(self.lower, np.clip(center - radius, 0.0, 1.0))
        new["upper"] = np.minimum(self.upper, np.clip(center + radius, 0.0, 1.0))
        for name, value in new.items():
            setattr(self, name, value if mask is None else np.where(mask, value, getattr(self, name)))

    @property
    def mean(self):
        """The plain sample mean (0 before any sample)."""
        return np.where(self.n > 0, self.sum_x / np.maximum(self.n, 1), 0.0)
