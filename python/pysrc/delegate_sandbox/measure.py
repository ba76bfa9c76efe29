"""Repeated and compared measurements, run inside one sandbox on the same
cores (issue 32): ``@delegate.remote(repeat=N, warmup=K)`` and
``delegate.compare(f, g, ...)`` submit :func:`repeated` or :func:`compared`
as the call, with the user's function(s) as arguments.

Both sides import this module (it is in the sandbox image and in the
wheel), so its functions and classes are pickled by reference. Standard
library only; Python 3.9.

Statistics follow pyperf and hyperfine: min, median with the median
absolute deviation (MAD), mean with the sample standard deviation, outliers
by the modified z-score (|0.6745 (x - median) / MAD| > 3.5), and an
"unstable" warning when the standard deviation is more than a tenth of the
mean (pyperf's threshold)."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

#: pyperf warns when std / mean exceeds this.
UNSTABLE_RATIO = 0.10
#: The modified z-score past which a run is an outlier (Iglewicz-Hoaglin).
OUTLIER_Z = 3.5


def _fmt(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(seconds) >= scale or unit == "ns":
            return "%.3g %s" % (seconds / scale, unit)
    return "%.3g s" % seconds  # pragma: no cover


class Stats:
    """Statistics of one series of durations (seconds)."""

    def __init__(self, seconds: Sequence[float]) -> None:
        if not seconds:
            raise ValueError("no measured run")
        self.seconds = [float(s) for s in seconds]
        s = self.seconds
        self.min = min(s)
        self.max = max(s)
        self.median = statistics.median(s)
        self.mad = statistics.median([abs(x - self.median) for x in s])
        self.mean = statistics.fmean(s)
        self.std = statistics.stdev(s) if len(s) > 1 else 0.0
        self.outliers: list[int] = []
        if self.mad > 0:
            self.outliers = [
                i for i, x in enumerate(s) if abs(0.6745 * (x - self.median) / self.mad) > OUTLIER_Z
            ]
        self.unstable = self.mean > 0 and self.std / self.mean > UNSTABLE_RATIO

    @property
    def warning(self) -> str | None:
        """Why the figures should not be trusted as they are, or None."""
        notes = []
        if self.unstable:
            notes.append(
                "unstable: the standard deviation is %.0f%% of the mean (more than %.0f%%); "
                "use more runs or a longer body" % (100 * self.std / self.mean, 100 * UNSTABLE_RATIO)
            )
        if self.outliers:
            notes.append("%d outlier run(s): %s" % (len(self.outliers), ", ".join(map(str, self.outliers))))
        return "; ".join(notes) or None

    def __repr__(self) -> str:
        return "%s ± %s (median ± MAD of %d runs; min %s, mean %s ± %s)" % (
            _fmt(self.median), _fmt(self.mad), len(self.seconds), _fmt(self.min), _fmt(self.mean), _fmt(self.std),
        )  # fmt: skip


class Repeated:
    """What ``repeat=N`` returns: the N measured runs' return ``values``
    and durations (``seconds``, after ``warmup`` unmeasured runs) and their
    ``stats``; ``value`` is the last run's return value."""

    def __init__(self, values: Sequence[Any], seconds: Sequence[float], warmup: int) -> None:
        self.values = list(values)
        self.seconds = list(seconds)
        self.warmup = warmup
        self.stats = Stats(self.seconds)

    @property
    def value(self) -> Any:
        return self.values[-1]

    @property
    def warning(self) -> str | None:
        return self.stats.warning

    def __repr__(self) -> str:
        w = self.warning
        return "<Repeated %r%s>" % (self.stats, "; WARNING: " + w if w else "")


class Comparison:
    """What ``delegate.compare(a, b, ...)`` returns: both series (run
    interleaved, ABAB..., in one sandbox), their ``stats``, and the ratio
    ``a / b`` of their times (the geometric mean of the paired ratios) with
    a 95% bootstrap confidence interval ``ci``."""

    def __init__(
        self,
        a_seconds: Sequence[float],
        b_seconds: Sequence[float],
        warmup: int,
        names: Sequence[str] = ("a", "b"),
    ) -> None:
        self.names = tuple(names)
        self.a = Stats(a_seconds)
        self.b = Stats(b_seconds)
        self.warmup = warmup
        logs = [math.log(x / y) for x, y in zip(self.a.seconds, self.b.seconds) if x > 0 and y > 0]
        if not logs:
            raise ValueError("no paired runs to compare")
        self.ratio = math.exp(statistics.fmean(logs))
        rng = random.Random(0)
        boots = sorted(
            statistics.fmean(rng.choice(logs) for _ in logs) for _ in range(2000)
        )  # fmt: skip
        self.ci = (math.exp(boots[int(0.025 * len(boots))]), math.exp(boots[int(0.975 * len(boots)) - 1]))

    @property
    def warning(self) -> str | None:
        notes = [n for n in (self.a.warning, self.b.warning) if n]
        if self.ci[0] <= 1.0 <= self.ci[1]:
            notes.append("no difference shown: the confidence interval contains 1")
        return "; ".join(notes) or None

    def __repr__(self) -> str:
        a, b = self.names
        w = self.warning
        return "<Comparison %s/%s = %.3f [%.3f, %.3f] (95%% CI, %d pairs)%s>" % (
            a, b, self.ratio, self.ci[0], self.ci[1], len(self.a.seconds), "; WARNING: " + w if w else "",
        )  # fmt: skip


def _timed(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - t0


def repeated(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], repeat: int, warmup: int
) -> Repeated:
    """Runs ``fn(*args, **kwargs)`` ``warmup`` times unmeasured, then
    ``repeat`` times measured (wall time, ``time.perf_counter``)."""
    for _ in range(warmup):
        fn(*args, **kwargs)
    values: list[Any] = []
    seconds: list[float] = []
    for _ in range(repeat):
        v, s = _timed(fn, args, kwargs)
        values.append(v)
        seconds.append(s)
    return Repeated(values, seconds, warmup)


def compared(
    a: Callable[..., Any],
    b: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    repeat: int,
    warmup: int,
) -> Comparison:
    """Runs ``a`` and ``b`` on the same arguments interleaved (ABAB...):
    ``warmup`` unmeasured pairs, then ``repeat`` measured pairs."""
    for _ in range(warmup):
        a(*args, **kwargs)
        b(*args, **kwargs)
    sa: list[float] = []
    sb: list[float] = []
    for _ in range(repeat):
        sa.append(_timed(a, args, kwargs)[1])
        sb.append(_timed(b, args, kwargs)[1])
    names = (getattr(a, "__name__", "a"), getattr(b, "__name__", "b"))
    return Comparison(sa, sb, warmup, names)
