"""The relaxations the search's bounds are made of, each held to brute force.

They all feed pruning: an overestimate of what a completion can reach would lose optima.
"""

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resource_worker.placement import relaxations as rx
from resource_worker.placement.diameter import Diameters
from resource_worker.placement.pool import PoolTables
from resource_worker.placement.score import distance
from resource_worker.placement.tree_sums import TreeSums
from tests.unit.test_placement import _instances


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


# -- floors over the PCI tree, against every selection of small pools -------------------------------

def _root_pools(instance):
    """(node, tables, root, most, fewest, device IDs under the root, mandatory among them) per root of an instance."""
    node, available, mandatory = instance
    tables = PoolTables(tuple(node[i] for i in sorted(set(available))))
    for root in range(tables.n_roots):
        most = [len(ids) if tables.root[c] == root else 0 for c, ids in enumerate(tables.ids)]
        fewest = [sum(i in mandatory for i in ids) if tables.root[c] == root else 0 for c, ids in enumerate(tables.ids)]
        devices = [i for c, ids in enumerate(tables.ids) if tables.root[c] == root for i in ids]
        yield node, tables, root, most, fewest, devices, [i for i in devices if i in mandatory]


def _selections_under(devices, forced, size):
    return [s for s in itertools.combinations(devices, size) if set(forced) <= set(s)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_instances())
def test_tree_sums_are_the_least_distance_sums(instance):
    for node, tables, root, most, fewest, devices, forced in _root_pools(instance):
        sums = TreeSums(tables, root, most, fewest)
        for size in range(max(1, len(forced)), len(devices) + 1):
            assert sums.least(size) == min(sum(distance(node[a].pci_path, node[b].pci_path)
                                               for a, b in itertools.combinations(s, 2))
                                           for s in _selections_under(devices, forced, size))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_instances())
def test_diameter_floors_never_exceed_a_selection(instance):
    for node, tables, root, most, fewest, devices, forced in _root_pools(instance):
        floors = Diameters(tables, root, most, fewest)
        paid = 0
        for c, count in enumerate(fewest):
            paid |= tables.card_bit[c] if count else 0
        paid_count = paid.bit_count() + sum(count for c, count in enumerate(fewest) if not tables.card_bit[c])
        for size in range(max(2, len(forced)), len(devices) + 1):
            for selection in _selections_under(devices, forced, size):
                largest = max(distance(node[a].pci_path, node[b].pci_path)
                              for a, b in itertools.combinations(selection, 2))
                assert floors.floor_with_cards(size, paid, len(devices)) <= largest
                # Cards as the pool's tables see them: a card with one device of the pool is none.
                cards = {tables.card_bit[c] for c, ids in enumerate(tables.ids) for i in ids if i in selection}
                used = len(cards - {0}) + sum(1 for c, ids in enumerate(tables.ids) for i in ids
                                              if i in selection and not tables.card_bit[c])
                assert floors.floor_with_cards(size, paid, used - paid_count) <= largest
