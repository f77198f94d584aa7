"""When a measurement has run long enough: the adaptive stop rule (issue 17), pure arithmetic.

A throughput test's per-second rates (or ping's per-echo RTTs) go through three steps:

1. **warm-up**: the leading samples MSER-5 picks (White 1997; batches of 5, the truncation
   that minimises the standard error of the rest, searched over the first half), or a fixed
   number of them;
2. **batch means**: the rest grouped into consecutive batches (default 2 s) so neighbouring
   samples' correlation mostly stays inside a batch (Law & Kelton, "Simulation Modeling and
   Analysis", batch means);
3. **interval**: Student's t confidence interval of the mean over the batch means. The test
   stops when its half-width is within `rel_half_width` of the mean (default 5 % at 95 %)
   once `min_s` seconds were measured, or at the cap (the plan's duration). netperf's
   ``-i max,min -I level,width`` applies the same rule over iterations; Georges, Buytaert and
   Eeckhout, "Statistically Rigorous Java Performance Evaluation", OOPSLA 2007, give it for
   repetitions, which `repetitions` here does (at least two).

Loss is a rare event: its interval is Wilson's score interval (Brown, Cai & DasGupta,
Statistical Science 16(2), 2001), and `packets_for_loss` computes how many packets that
interval needs to be within max(rel x p, an absolute floor), instead of guessing a length.

No I/O, no lab imports beyond lab.model.stats (Student's t from scipy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from lab.model.stats import t_quantile

#: why a measurement stopped (results column ``stop_reason``)
REASONS = {
    "ci": "the interval of the mean reached the target width",
    "cap": "the hard cap (the plan's duration or count) came first",
    "fixed": "adaptive = false: the fixed length",
    "failed": "the tool failed before the rule could decide",
}


@dataclass(frozen=True)
class Rule:
    """The stop rule's knobs (a test's `adaptive_*` parameters fill them)."""

    #: target half-width of the interval, relative to the mean (0.05 = +-5 %)
    rel_half_width: float = 0.05
    confidence: float = 0.95
    #: measured seconds (after the warm-up) before the rule may stop a test
    min_s: float = 10.0
    #: seconds of samples per batch
    batch_s: float = 2.0
    #: None: MSER-5 picks the warm-up; a number: that many seconds are dropped
    warmup_s: float | None = None
    #: loss interval: stop only when its half-width <= max(rel_half_width * p, loss_abs)
    #: (a fraction: 0.001 = 0.1 percentage points); None: loss is recorded, not a criterion
    loss_abs: float | None = 0.001


@dataclass(frozen=True)
class Interval:
    mean: float
    half_width: float
    n: int
    confidence: float

    @property
    def rel(self) -> float:
        """Half-width relative to the mean (inf for a zero mean)."""
        return self.half_width / abs(self.mean) if self.mean else math.inf

    def to_json(self) -> dict:
        return {
            "mean": self.mean,
            "half_width": self.half_width,
            "rel": None if math.isinf(self.rel) else self.rel,
            "n": self.n,
            "confidence": self.confidence,
        }


@dataclass(frozen=True)
class Decision:
    """What the rule says about the samples so far."""

    stop: bool
    #: a key of REASONS when stop, else "continue"
    reason: str
    interval: Interval | None
    warmup_samples: int
    batches: int
    #: seconds more the rule estimates it needs (0 when stopping)
    more_s: float


def mean_interval(values: list[float], confidence: float = 0.95) -> Interval | None:
    """Student's t interval of the mean of `values` (None for fewer than two)."""
    n = len(values)
    if n < 2:
        return None
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    t = t_quantile(1 - (1 - confidence) / 2, n - 1)
    return Interval(m, t * sd / math.sqrt(n), n, confidence)


def mser5(samples: list[float]) -> int:
    """How many leading samples MSER-5 drops as warm-up (a multiple of 5).

    Means of consecutive batches of 5 (a trailing part batch is ignored); the truncation d
    (in batches, within the first half) minimising sum((z_i - mean)^2) / (k - d)^2 over the
    k - d kept batch means wins; ties go to the shorter truncation.
    """
    k = len(samples) // 5
    if k < 2:
        return 0
    z = [sum(samples[5 * i : 5 * i + 5]) / 5 for i in range(k)]
    best, best_d = math.inf, 0
    for d in range(k // 2 + 1):
        rest = z[d:]
        m = sum(rest) / len(rest)
        stat = sum((x - m) ** 2 for x in rest) / len(rest) ** 2
        if stat < best:
            best, best_d = stat, d
    return 5 * best_d


def batch_means(samples: list[float], per_batch: int) -> list[float]:
    """Means of consecutive complete batches of `per_batch` samples."""
    per_batch = max(1, per_batch)
    k = len(samples) // per_batch
    return [sum(samples[per_batch * i : per_batch * (i + 1)]) / per_batch for i in range(k)]


def evaluate(
    samples: list[float],
    rule: Rule,
    *,
    sample_s: float = 1.0,
    elapsed_s: float | None = None,
    cap_s: float,
) -> Decision:
    """The rule over `samples` taken every `sample_s` seconds (elapsed_s: the time they took,
    default len * sample_s). Stops on the interval once `min_s` measured seconds are in,
    or at `cap_s`."""
    elapsed = len(samples) * sample_s if elapsed_s is None else elapsed_s
    if rule.warmup_s is None:
        drop = mser5(samples)
    else:
        drop = min(len(samples), math.ceil(rule.warmup_s / sample_s - 1e-9))
    kept = samples[drop:]
    per_batch = max(1, round(rule.batch_s / sample_s))
    means = batch_means(kept, per_batch)
    iv = mean_interval(means, rule.confidence)
    measured = len(kept) * sample_s
    at_cap = elapsed >= cap_s - 1e-9
    if iv is not None and measured >= rule.min_s - 1e-9 and iv.rel <= rule.rel_half_width:
        return Decision(True, "ci", iv, drop, len(means), 0.0)
    if at_cap:
        return Decision(True, "cap", iv, drop, len(means), 0.0)
    more = max(rule.min_s - measured, 0.0)
    if iv is not None and iv.mean:
        # batches needed for the target width at the current spread (t of the current df)
        sd = iv.half_width / t_quantile(1 - (1 - rule.confidence) / 2, iv.n - 1) * math.sqrt(iv.n)
        need = math.ceil(
            (
                sd
                * NormalDist().inv_cdf(1 - (1 - rule.confidence) / 2)
                / (rule.rel_half_width * abs(iv.mean))
            )
            ** 2
        )
        more = max(more, (need - len(means)) * per_batch * sample_s)
    more = max(more, per_batch * sample_s)
    return Decision(False, "continue", iv, drop, len(means), min(more, cap_s - elapsed))


# ---------------------------------------------------------------------- whole cycles


#: whole cycles the regenerative interval needs (its t has MIN_CYCLES - 1 degrees of freedom)
MIN_CYCLES = 3


def regenerative_interval(
    rates: list[float], cuts: list[int], confidence: float = 0.95
) -> Interval | None:
    """The interval of a long-run rate over whole cycles (the regenerative method: Crane &
    Iglehart, Operations Research 23(1), 1975; Law & Kelton, "Simulation Modeling and
    Analysis", the regenerative method). `cuts` are indices of `rates` (per-second samples) in
    which a cycle ended (a loss-based sender's congestion events); cycle k is the samples
    after cut k up to and including cut k+1. Its rate is the ratio estimator R = sum Y / sum d
    (Y a cycle's samples summed, d its length); s^2 = sum (Y - R d)^2 / (n - 1) over the n
    cycles; half-width t(n-1) s / (mean d sqrt n). None for fewer than MIN_CYCLES cycles.

    Samples inside one cycle are correlated over the whole cycle (a sawtooth's ramp), so an
    interval over batches shorter than a cycle is too narrow where cycles are long; cycles
    themselves are nearly independent (each starts from the window a loss left)."""
    cuts = sorted(set(cuts))
    cycles = [rates[a + 1 : b + 1] for a, b in zip(cuts, cuts[1:], strict=False)]
    cycles = [c for c in cycles if c]
    n = len(cycles)
    if n < MIN_CYCLES:
        return None
    ys = [sum(c) for c in cycles]
    ds = [len(c) for c in cycles]
    r = sum(ys) / sum(ds)
    s = math.sqrt(sum((y - r * d) ** 2 for y, d in zip(ys, ds, strict=True)) / (n - 1))
    t = t_quantile(1 - (1 - confidence) / 2, n - 1)
    return Interval(r, t * s / (sum(ds) / n * math.sqrt(n)), n, confidence)


# ---------------------------------------------------------------------- loss (rare events)


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def wilson(lost: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval of a proportion lost/n, as (low, high) fractions."""
    if n <= 0:
        return (0.0, 1.0)
    z = _z(confidence)
    p = lost / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (max(0.0, centre - half), min(1.0, centre + half))


def loss_target(p: float, rule: Rule) -> float:
    """The half-width the loss interval must reach: max(rel x p, loss_abs)."""
    return max(rule.rel_half_width * p, rule.loss_abs or 0.0)


def packets_for_loss(p: float, rule: Rule) -> int:
    """Packets for Wilson's interval around a loss rate `p` to reach `loss_target`.

    The smallest n (doubling, then bisection) whose interval at p has half-width <= target.
    """
    target = loss_target(p, rule)
    if target <= 0:
        raise ValueError("loss target is zero: give rel_half_width > 0 or loss_abs > 0")

    def half(n: int) -> float:
        z = _z(rule.confidence)
        return z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))

    hi = 1
    while half(hi) > target:
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if half(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


def loss_decision(lost: int, n: int, rule: Rule) -> tuple[bool, int, dict]:
    """(met, packets still needed, the interval reached) for `lost` of `n` packets."""
    lo, hi = wilson(lost, n, rule.confidence)
    p = lost / n if n else 0.0
    info = {
        "lost": lost,
        "packets": n,
        "low": lo,
        "high": hi,
        "half_width": (hi - lo) / 2,
        "target_half_width": loss_target(p, rule),
        "confidence": rule.confidence,
    }
    if rule.loss_abs is None:  # recorded, not a criterion (ping: its primary is RTT)
        return True, 0, info
    need = packets_for_loss(p, rule)
    info["packets_needed"] = need
    return n >= need, max(0, need - n), info


# ---------------------------------------------------------------------- repetitions


def repetitions(values: list[float], rule: Rule, *, max_reps: int) -> Decision:
    """Stop repeating once at least two repetitions' interval is within the target, or at
    `max_reps` (Georges et al. 2007's rule over repetitions)."""
    iv = mean_interval(values, rule.confidence)
    n = len(values)
    if iv is not None and (iv.rel <= rule.rel_half_width or iv.half_width == 0):
        return Decision(True, "ci", iv, 0, n, 0.0)
    if n >= max_reps:
        return Decision(True, "cap", iv, 0, n, 0.0)
    return Decision(False, "continue", iv, 0, n, 0.0)
