"""The relaxations the search's bounds are made of, each held to brute force.

They all feed pruning: an overestimate of what a completion can reach would lose optima.
"""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from resource_worker.placement import relaxations as rx


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3)), max_size=5), st.integers(0, 10))
def test_level_pairs_bound_every_allocation(nodes, added):
    pairs = {grown: sum(rx.pairs(held + n) for (held, _), n in zip(nodes, grown))
             for grown in itertools.product(*(range(room + 1) for _, room in nodes)) if sum(grown) <= added}
    best = max(pairs.values())
    bound = rx.level_pairs(tuple(nodes), added)
    assert bound.pairs >= best
    if sum(1 for held, room in nodes if held and room) <= rx.EXACT_NODES:
        assert bound.pairs == best
    # What the search pins from it must hold for every allocation reaching the bound.
    for grown, value in pairs.items():
        if value == bound.pairs:
            assert all(grown[i] == 0 for i in bound.empty)
            assert all(grown[i] == nodes[i][1] for i in bound.full)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4)), min_size=1, max_size=4), st.data())
def test_best_splits_finds_every_best_split(roots, data):
    base = [b for b, _ in roots]
    spare = [s for _, s in roots]
    grow = data.draw(st.integers(0, sum(spare)))
    splits = [split for split in itertools.product(*(range(s + 1) for s in spare)) if sum(split) == grow]
    value = {split: sum((b + a) ** 2 for b, a in zip(base, split)) for split in splits}
    top = max(value.values())
    found = rx.best_splits(base, spare, grow)
    assert found.squares == top
    assert sorted(set(found.best)) == sorted(split for split in splits if value[split] == top)
    assert rx.best_splits(base, spare, sum(spare) + 1) is None
    assert rx.best_splits(base, spare, -1) is None


def _groups_opened(group, paid, counts):
    bits = paid
    for bit, k in zip(group, counts):
        bits |= bit if k else 0
    return bin(bits).count("1") + sum(k for bit, k in zip(group, counts) if not bit)


# (group bit, fewest, extra) per class; bit 0: each device a group of its own.
_CLASSES = st.lists(st.tuples(st.sampled_from([0, 1, 2, 4]), st.integers(0, 2), st.integers(0, 3)), min_size=1,
                    max_size=5)


def _selections(classes, paid, data):
    """(group, fewest, most, target, every count vector reaching target, fewest groups any of them opens)."""
    group = [bit for bit, _, _ in classes]
    fewest = [low for _, low, _ in classes]
    most = [low + extra for _, low, extra in classes]
    target = data.draw(st.integers(sum(fewest), sum(most)))
    counts = [c for c in itertools.product(*(range(low, cap + 1) for low, cap in zip(fewest, most))) if sum(c) == target]
    return group, fewest, most, target, counts, min(_groups_opened(group, paid, c) for c in counts)


@settings(max_examples=300, deadline=None)
@given(_CLASSES, st.sampled_from([0, 1, 2, 4]), st.data())
def test_open_groups_keeps_every_selection_with_fewest_groups(classes, paid, data):
    group, fewest, most, target, counts, fewest_groups = _selections(classes, paid, data)
    opened = rx.open_groups(list(range(len(classes))), group, paid, target, most, fewest)
    assert opened.groups == fewest_groups
    # What it narrows must hold for every selection that opens that few groups.
    for c in counts:
        if _groups_opened(group, paid, c) == fewest_groups:
            assert all(low <= k <= cap for low, k, cap in zip(fewest, c, most))


@settings(max_examples=300, deadline=None)
@given(_CLASSES, st.sampled_from([0, 1, 2, 4]), st.data())
def test_room_in_new_groups_bounds_every_selection_with_fewest_groups(classes, paid, data):
    # The cross-root bound caps what a root can take by the groups a completion may still open:
    # for any subset of the classes (those under one root), no selection with fewest groups overshoots it.
    group, fewest, most, target, counts, fewest_groups = _selections(classes, paid, data)
    under_root = data.draw(st.lists(st.sampled_from(range(len(classes))), unique=True))
    opened = rx.open_groups(list(range(len(classes))), group, paid, target, most[:], fewest[:])
    room = rx.room_in_new_groups(under_root, group, opened.paid, opened.new_groups, most, fewest)
    for c in counts:
        if _groups_opened(group, paid, c) == fewest_groups:
            assert sum(c[i] - fewest[i] for i in under_root) <= room

