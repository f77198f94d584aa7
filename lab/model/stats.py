"""The statistics of `lab check`'s regression rule and of the lab's comparisons, from scipy.stats:
Student's t (its tail and its quantile), a one-sided Welch test over the repetitions of two runs,
a run-level prediction test against several baseline runs, and Kendall's tau-b.

scipy.stats takes ~0.8 s to import and lab.measure loads this module (through lab.model.stoprule)
whenever a command lists the tests, so `_scipy_stats` imports it on the first computation."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType


def _scipy_stats() -> ModuleType:
    """scipy.stats, imported on first use."""
    import scipy.stats  # ~0.8 s to import: paid by the first statistic computed, not every command

    return scipy.stats


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom."""
    return float(_scipy_stats().t.sf(t, df))


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (p > 0.5: the intervals')."""
    if not 0.5 < p < 1:
        raise ValueError(f"p must be in (0.5, 1), got {p}")
    return float(_scipy_stats().t.ppf(p, df))


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
    """One-sided Welch t-test of H0 "new is not worse than base"; t > 0 when new is worse.

    t and p come from scipy.stats.ttest_ind_from_stats (unequal variances; ~60x faster than
    ttest_ind on lists, which `lab check` and its tests call thousands of times); the
    Welch-Satterthwaite degrees of freedom it uses are computed here for the report, which
    names them."""
    mb, sb = mean_sd(base)
    mn, sn = mean_sd(new)
    diff = (mb - mn) if higher_is_better else (mn - mb)  # > 0: worse
    if len(base) < 2 or len(new) < 2 or sb == sn == 0:
        return TestResult(None, None, 0.0 if diff > 0 else 1.0)
    # the side expected to be larger first, so that "greater" means "new is worse"
    b, n = (mb, sb, len(base)), (mn, sn, len(new))
    first, second = (b, n) if higher_is_better else (n, b)
    r = _scipy_stats().ttest_ind_from_stats(*first, *second, equal_var=False, alternative="greater")
    vb, vn = sb * sb / len(base), sn * sn / len(new)
    df = (vb + vn) ** 2 / (vb * vb / (len(base) - 1) + vn * vn / (len(new) - 1))
    return TestResult(float(r.statistic), df, float(r.pvalue))


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
    t = (mean - new) / (sd * sqrt(1 + 1/k)) with k - 1 degrees of freedom (scipy has no
    prediction test; its t distribution gives the tail)."""
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


def kendall_tau_b(x: list[float], y: list[float]) -> float | None:
    """Kendall's tau-b of two paired samples (scipy.stats.kendalltau); None when undefined
    (n < 2 or one side all tied).

    tau_b = (C - D) / sqrt((n0 - n1) (n0 - n2)) with C/D the concordant/discordant pairs,
    n0 = n(n-1)/2, n1/n2 the pairs tied in x/in y.
    """
    if len(x) != len(y):
        raise ValueError("x and y differ in length")
    if len(x) < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    return float(_scipy_stats().kendalltau(x, y, variant="b").statistic)
