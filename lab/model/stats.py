"""The statistics of `lab check`'s regression rule, without scipy: Student's t via the
regularized incomplete beta function (Numerical Recipes 6.4), a one-sided Welch test over the
repetitions of two runs, and a run-level prediction test against several baseline runs."""

from __future__ import annotations

import math
from dataclasses import dataclass


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (Numerical Recipes 6.4, modified
    Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1.0) < 3e-14:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
    lbt += b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom."""
    p = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return p if t > 0 else 1.0 - p


def mean_sd(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0)


@dataclass(frozen=True)
class TestResult:
    t: float | None  # None: fewer than 2 samples on a side, or no spread at all
    df: float | None
    p: float  # one-sided: P(the new sample is not worse), small = worse
    kind: str = "welch"  # "welch" (repetitions of one baseline run) | "runs" (several)


def welch_worse(base: list[float], new: list[float], higher_is_better: bool) -> TestResult:
    """One-sided Welch t-test of H0 "new is not worse than base"."""
    mb, sb = mean_sd(base)
    mn, sn = mean_sd(new)
    diff = (mb - mn) if higher_is_better else (mn - mb)  # > 0: worse
    if len(base) < 2 or len(new) < 2:
        return TestResult(None, None, 0.0 if diff > 0 else 1.0)
    vb, vn = sb * sb / len(base), sn * sn / len(new)
    se = math.sqrt(vb + vn)
    if se == 0:
        return TestResult(None, None, 0.0 if diff > 0 else 1.0)
    t = diff / se
    df = (vb + vn) ** 2 / (vb * vb / (len(base) - 1) + vn * vn / (len(new) - 1))
    return TestResult(t, df, t_sf(t, df))


def regressed(
    base: list[float], new: list[float], tolerance: float, higher_is_better: bool, alpha: float
) -> tuple[bool, float, TestResult]:
    """The regression rule: worse by more than `tolerance` (ratio of the means) and the Welch
    test significant at `alpha`. Returns (regressed, ratio new/base, test)."""
    mb, mn = sum(base) / len(base), sum(new) / len(new)
    ratio = mn / mb if mb else math.inf
    beyond = ratio < 1 - tolerance if higher_is_better else ratio > 1 + tolerance
    w = welch_worse(base, new, higher_is_better)
    return beyond and w.p < alpha, ratio, w


def runs_worse(base_means: list[float], new_mean: float, higher_is_better: bool) -> TestResult:
    """One-sided prediction test of H0 "the new run is not worse than the baseline runs": the
    spread of the k baseline runs' means is the noise a run carries (drift between bring-ups and
    machine states included, which the repetitions of one run do not show);
    t = (mean - new) / (sd * sqrt(1 + 1/k)) with k - 1 degrees of freedom."""
    k = len(base_means)
    m, s = mean_sd(base_means)
    diff = (m - new_mean) if higher_is_better else (new_mean - m)
    se = s * math.sqrt(1 + 1 / k)
    if k < 2 or se == 0:
        return TestResult(None, None, 0.0 if diff > 0 else 1.0, "runs")
    t = diff / se
    return TestResult(t, k - 1.0, t_sf(t, k - 1.0), "runs")


def regressed_runs(
    base_runs: list[list[float]],
    new: list[float],
    tolerance: float,
    higher_is_better: bool,
    alpha: float,
) -> tuple[bool, float, TestResult]:
    """The regression rule against several baseline runs: worse than the mean of their means by
    more than `tolerance`, and outside their spread (runs_worse) at `alpha`."""
    means = [sum(v) / len(v) for v in base_runs if v]
    mb, mn = sum(means) / len(means), sum(new) / len(new)
    ratio = mn / mb if mb else math.inf
    beyond = ratio < 1 - tolerance if higher_is_better else ratio > 1 + tolerance
    w = runs_worse(means, mn, higher_is_better)
    return beyond and w.p < alpha, ratio, w
