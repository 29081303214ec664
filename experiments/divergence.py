"""When did a run's loss diverge? One precise definition, used everywhere.

Let S be the loss smoothed by a trailing mean over `window` logged steps
(non-finite losses count as +inf, so one NaN makes S infinite from then on),
and m(t) = min_{s <= t} S(s) its running minimum. The divergence step is the
first logged step t such that
    S(s) > m(t) + margin    for every logged s >= t,
i.e. the smoothed loss has risen `margin` nats above the best it had reached
and never comes back. A transient spike that recovers is not a divergence.
Only steps followed by at least `window` more logged steps qualify, so the
last few steps of a run cannot count as "staying there" by default.
A run with no such step has diverged "none" (returned as None).
"""

import math


def smoothed(losses: list[float | None], window: int) -> list[float]:
    out, acc = [], []
    for loss in losses:
        acc.append(math.inf if loss is None or not math.isfinite(loss) else loss)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def divergence_step(steps: list[int], losses: list[float | None],
                    window: int = 50, margin: float = 0.5) -> int | None:
    s = smoothed(losses, window)
    # suffix_min[i] = min(s[i:]): "stays above from t on" in one comparison.
    suffix_min = s[:]
    for i in range(len(s) - 2, -1, -1):
        suffix_min[i] = min(s[i], suffix_min[i + 1])
    running_min = math.inf
    for i, step in enumerate(steps[: len(steps) - window]):
        running_min = min(running_min, s[i])
        if suffix_min[i] > running_min + margin:
            return step
    return None
