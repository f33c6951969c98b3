"""The exact pieces the search is made of, each held to brute force on small pools.

None of them is a bound: each claims the exact optimum of what it names, and the search drops a branch on
their word, so an error here would lose optima.
"""

import ast
import itertools
import pathlib
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import resource_worker.placement
from resource_worker.placement import score
from resource_worker.placement.balls import Target, feasible_balls
from resource_worker.placement.counting import FREE, SOLO, Limits, bundles_by_count, fewest_bundles, numa_options
from resource_worker.placement.geometry import forest
from resource_worker.placement.pool import NO_CARD, PoolTables
from resource_worker.placement.shares import least_shares
from resource_worker.placement.state import RequestClasses, WorkMeter
from resource_worker.placement.tree_dp import Encoding, Knapsack
from tests.support.placement_instances import placement_instances

ENOUGH_WORK = 10 ** 9
_SLOW = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _bundles(bundle_of, counts):
    """Cards a count vector uses: each card once, each device of a class with no card once; paid cards none."""
    cards = {bundle for bundle, n in zip(bundle_of, counts, strict=True) if n and bundle > SOLO}
    return len(cards) + sum(n for bundle, n in zip(bundle_of, counts, strict=True) if bundle == SOLO)


def _vectors(limits, target=None):
    vectors = itertools.product(*(range(low, high + 1) for low, high in zip(*limits, strict=True)))
    return [v for v in vectors if target is None or sum(v) == target]


# (bundle: a card's bit, SOLO for none, FREE paid for), fewest, extra room
_CLASSES = st.lists(st.tuples(st.sampled_from([FREE, SOLO, SOLO, 1, 2, 4]), st.integers(0, 2), st.integers(0, 3)),
                    min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(_CLASSES)
def test_fewest_bundles_is_the_least_over_every_selection(classes):
    bundle_of = [bundle for bundle, _, _ in classes]
    limits = Limits(tuple(low for _, low, _ in classes), tuple(low + extra for _, low, extra in classes))
    by_count = bundles_by_count(range(len(classes)), bundle_of, limits)
    for target in range(sum(limits.most) + 2):
        vectors = _vectors(limits, target)
        expected = min((_bundles(bundle_of, v) for v in vectors), default=None)
        assert fewest_bundles(range(len(classes)), bundle_of, limits, target) == expected
        assert (by_count[target] if target < len(by_count) else None) == expected


def _pool(instance):
    node, available, mandatory = instance
    pool = {d: node[d] for d in sorted(set(available))}
    return pool, PoolTables(tuple(pool[d] for d in sorted(pool))), sorted(set(mandatory))


@_SLOW
@given(placement_instances())
def test_numa_options_hold_exactly_the_numa_optimal_selections(instance):
    pool, tables, mandatory = _pool(instance)
    classes = RequestClasses(tables, set(mandatory))
    ids = sorted(pool)
    for size in range(max(1, len(mandatory)), len(ids) + 1):
        found = numa_options(tables, classes.mandatory, size)
        selections = [mandatory + list(extra) for extra in
                      itertools.combinations([d for d in ids if d not in mandatory], size - len(mandatory))]
        best = min(score(s, pool)[:2] for s in selections)
        assert (found.unknown, found.nodes) == best and found.complete
        for selection in selections:
            counts = [sum(d in selection for d in tables.ids[c]) for c in range(len(tables.size))]
            inside = any(all(low <= n <= high for n, low, high in zip(counts, *option, strict=True))
                         for option in found.options)
            # Within an option exactly when the selection meets the NUMA optimum.
            assert inside == (score(selection, pool)[:2] == best)


def _root_problems(instance):
    """Per root of the pool: its tree, limits holding the mandatory devices, how classes count cards.

    As the search hands them over: a card whose classes hang from several nodes is decided before (here:
    opened, so its devices are free); the others count once where their classes hang.
    """
    pool, tables, mandatory = _pool(instance)
    classes = RequestClasses(tables, set(mandatory))
    hangs: dict[int, set] = {}
    for c, card in enumerate(tables.card_bit):
        hangs.setdefault(card, set()).add((tables.root[c], tables.attach[c]))
    bundle_of = [SOLO if card == NO_CARD else card if len(hangs[card]) == 1 else FREE for card in tables.card_bit]
    limits = Limits(tuple(classes.mandatory), tuple(tables.size))
    for tree in forest(tables):
        yield pool, tables, classes, tree, bundle_of, limits


def _class_distance(tables, a, b, same):
    """Between two devices of classes a and b (two of one class when same)."""
    return 2 * tables.chain[a] if same else next(d for c, d in _links(tables)[a] if c == b)


def _links(tables):
    return {c: pairs for tree in forest(tables) for c, pairs in tree.links.items()}


def _distances(tables, counts):
    """(largest, sum) of the distances among the devices a count vector at one root names."""
    devices = [c for c, n in counts.items() for _ in range(n)]
    pairs = [_class_distance(tables, a, b, i == j or a == b)
             for (i, a), (j, b) in itertools.combinations(enumerate(devices), 2)]
    return max(pairs, default=0), sum(pairs)


@_SLOW
@given(placement_instances())
def test_least_diameter_and_widest_balls_match_every_selection(instance):
    for _, tables, _, tree, bundle_of, limits in _root_problems(instance):
        local = Limits(tuple(low if c in tree.index else 0 for c, low in enumerate(limits.fewest)),
                       tuple(high if c in tree.index else 0 for c, high in enumerate(limits.most)))
        forced = sum(local.fewest)
        for count in range(max(2, forced), sum(local.most) + 1):
            bundles = fewest_bundles(tree.classes, bundle_of, local, count)
            vectors = [dict(zip(tree.classes, (v[c] for c in tree.classes), strict=True))
                       for v in _vectors(local, count) if _bundles(bundle_of, v) == bundles]
            diameters = {tuple(v.items()): _distances(tables, v)[0] for v in vectors}
            found = feasible_balls(tree, local, bundle_of, Target(count, bundles, forced), WorkMeter(ENOUGH_WORK))
            assert found.diameter == min(diameters.values())
            for key, diameter in diameters.items():
                if diameter <= found.diameter:
                    assert any(all(n <= ball.most.get(c, 0) for c, n in key if n) for ball in found.balls)


@_SLOW
@given(placement_instances())
def test_the_tree_knapsack_finds_the_least_cards_distance_sum_and_ids(instance):
    for pool, tables, classes, tree, bundle_of, limits in _root_problems(instance):
        encoding = Encoding.for_pool(sum(tables.size), max(tables.depth))
        knapsack = Knapsack(classes, limits.fewest, bundle_of, tables.chain, encoding, WorkMeter(ENOUGH_WORK))
        most = {c: tables.size[c] for c in tree.classes}
        local = Limits(tuple(limits.fewest[c] if c in most else 0 for c in range(len(tables.size))),
                       tuple(most.get(c, 0) for c in range(len(tables.size))))
        for count in range(1, sum(most.values()) + 1):
            best = None
            for vector in _vectors(local, count):
                counts = {c: n for c, n in enumerate(vector) if n}
                chosen = classes.chosen(counts)
                # Smaller sorted IDs first: the knapsack's ID weight orders them the same way.
                key = (_bundles(bundle_of, vector), _distances(tables, counts)[1], sorted(chosen))
                if best is None or key < best:
                    best = key
            solution = knapsack.solve(tree, most, count)
            if best is None:
                assert solution is None
                continue
            decoded = encoding.decode(solution.value)
            assert (decoded.bundles, decoded.distance_sum) == best[:2]
            assert sorted(classes.chosen(knapsack.counts(solution))) == best[2]
            assert score(best[2], pool).distance_sum == decoded.distance_sum


def test_least_shares_are_every_share_of_the_least_sum_as_brute_force_finds_them():
    rng = random.Random(13)
    for _ in range(400):
        places = rng.randint(1, 4)
        values = [[None if rng.random() < 0.25 else rng.randint(-3, 6) for _ in range(rng.randint(1, 5))]
                  for _ in range(places)]
        total = rng.randint(0, 8)
        sums = {share: sum(values[i][n] for i, n in enumerate(share))
                for share in itertools.product(*(range(len(place)) for place in values))
                if sum(share) == total and all(values[i][n] is not None for i, n in enumerate(share))}
        least = min(sums.values(), default=None)
        expected = sorted(share for share, value in sums.items() if value == least)
        found = least_shares(values, total, WorkMeter(ENOUGH_WORK))
        assert sorted(found) == expected and len(found) == len(set(found)), (values, total)


def test_no_function_of_placement_runs_over_sixty_lines():
    # The search is read function by function: each keeps to one step of it.
    long = [(path.name, node.name, node.end_lineno - node.lineno + 1)
            for path in sorted(pathlib.Path(resource_worker.placement.__file__).parent.glob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 60]
    assert not long
