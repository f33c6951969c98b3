"""The ways to share a count of devices over places with the least sum of values.

Invariant: `values[i][n]` is what giving place i exactly n devices adds (None: it cannot take n), and
every share returned gives each place a count it can take, adds up to the total, and has the least sum;
every such share is returned, each once. Work is charged to the meter as the table is filled and walked.
"""

from __future__ import annotations

from resource_worker.placement.state import WorkMeter


def least_shares(values: list[list], total: int, meter: WorkMeter) -> list[tuple[int, ...]]:
    """Every way to give each place a count, adding up to `total`, with the least sum of values."""
    # reach[i][t]: the least value of t devices in the first i places; the last place only needs `total`.
    reach: list[list] = [[0]]
    for place in values[:-1]:
        previous = reach[-1]
        row: list = [None] * min(len(previous) + len(place) - 1, total + 1)
        for t, before in enumerate(previous):
            if before is None:
                continue
            meter.charge(len(place))
            for n, value in enumerate(place[:len(row) - t]):
                if value is not None and (row[t + n] is None or before + value < row[t + n]):
                    row[t + n] = before + value
        reach.append(row)
    last, before = values[-1], reach[-1]
    meter.charge(len(last))
    ends = [before[total - n] + value for n, value in enumerate(last[:total + 1])
            if value is not None and total - n < len(before) and before[total - n] is not None]
    if not ends:
        return []
    best = min(ends)
    shares: list[tuple[int, ...]] = []
    # Back from the last place: every count whose value and best rest make up the least total.
    pending: list[tuple[int, int, int, tuple[int, ...]]] = [(len(values), total, best, ())]
    while pending:
        places, left, target, tail = pending.pop()
        if places == 0:
            shares.append(tail)
            continue
        place, before = values[places - 1], reach[places - 1]
        for n in range(min(len(place) - 1, left), -1, -1):
            if place[n] is not None and left - n < len(before) and before[left - n] is not None \
                    and before[left - n] + place[n] == target:
                meter.charge(1)
                pending.append((places - 1, left - n, before[left - n], (n,) + tail))
    return shares
