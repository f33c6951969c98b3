"""The largest-distance component at one PCI root, exactly: the least diameter that still meets the card
optimum, and the widest balls of that diameter.

Invariant: a ball is "feasible" when the devices it holds, within the class
limits, include every forced device of the root and can make up `count`
devices with no more than `bundles` bundles (cards, or devices with no card). `feasible_balls` without a diameter
finds the least D for which some centre's ball is feasible: no selection
meeting the card count has a smaller largest distance at this root, and some
has exactly D. For that D (or the one given) it returns the feasible balls none
of which holds another, so every selection meeting the card count with largest
distance at most D lies within one of them. Centres are visited by a lower bound
on the diameter at which their ball could first be feasible (enough devices
within the limits, every forced one in), and none once that bound passes the best.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from resource_worker.placement.counting import FREE, SOLO, Limits
from resource_worker.placement.geometry import NO_PENDANT, Center, RootTree
from resource_worker.placement.state import WorkMeter


class Target(NamedTuple):
    """What a root's share of a selection must meet."""

    devices: int
    bundles: int
    forced: int
    """Forced devices at the root: a feasible ball holds all of them."""


class Ball(NamedTuple):
    most: dict[int, int]
    """The classes the ball holds, with the most devices each may give inside it."""


class Balls(NamedTuple):
    diameter: int
    balls: list[Ball]


def feasible_balls(tree: RootTree, limits: Limits, bundle_of: Sequence[int], target: Target, meter: WorkMeter,
                   diameter: int | None = None, at_most: int | None = None) -> Balls | None:
    """The least diameter meeting `target`, if at most `at_most`, (or the one given) and its widest feasible
    balls; None if there is none."""
    fewest, most = limits
    held = [c for c in tree.classes if most[c]]
    if sum(most[c] for c in held) == target.devices:
        # Every device the root may give is taken: one ball, as wide as they lie apart.
        meter.charge(len(held) * len(held))
        inside = set(held)
        widest = max([2 * tree.chain[c] for c in held if most[c] > 1] +
                     [distance for c in held for other, distance in tree.links[c] if other in inside], default=0)
        return Balls(max(widest, diameter or 0), [Ball({c: most[c] for c in held})])
    forced = [tree.index[c] for c in tree.classes if fewest[c]]
    ranked: list[tuple[int, int, Center]] = []
    for center in tree.centers:
        if center.pendant != NO_PENDANT and fewest[center.pendant] > 1:
            continue    # a pendant centre holds one device of its class: not a class that must give two
        # A lower bound on the diameter at which the ball is feasible: it must hold enough devices, and the
        # forced ones.
        meter.charge(1 + len(forced))
        reachable, enough, steps = 0, None, 0
        for reach, c in zip(center.reaches, center.classes, strict=True):
            steps += 1
            reachable += min(most[c], 1) if c == center.pendant else most[c]
            if reachable >= target.devices:
                enough = reach
                break
        meter.record(steps)
        if enough is None:
            continue
        floor = max([enough] + [center.by_class[i] for i in forced])
        if center.limit is None or floor < center.limit:
            ranked.append((floor, len(ranked), center))
    ranked.sort()
    # The diameter searched up to: the one given, else the best so far, else the caller's bound.
    best = diameter if diameter is not None else at_most
    found = diameter is not None
    hits: list[Center] = []
    for floor, _, center in ranked:
        if best is not None and floor > best:
            break
        feasible_at = _first_feasible(center, limits, bundle_of, target, best, meter)
        if feasible_at is None:
            continue
        if not found or (best is not None and feasible_at < best and diameter is None):
            best, hits, found = feasible_at, [], True
        hits.append(center)
    if not found or best is None:
        return None
    return Balls(best, _widest([_ball(center, limits, best, meter) for center in hits], meter))


def _first_feasible(center: Center, limits: Limits, bundle_of: Sequence[int], target: Target, stop: int | None,
                    meter: WorkMeter) -> int | None:
    """The least reach, up to `stop`, at which the centre's ball is feasible."""
    fewest, most = limits
    reaches = center.reaches
    if center.limit is not None:
        stop = center.limit - 1 if stop is None else min(stop, center.limit - 1)
    supply = forced = free = solo_forced = solo_rooms = 0
    card_room: dict[int, int] = {}
    card_forced: set[int] = set()
    last = len(reaches) - 1
    for i, (reach, c) in enumerate(zip(reaches, center.classes, strict=True)):
        if stop is not None and reach > stop:
            meter.record(i + 1)
            return None
        room = most[c]
        if room:
            if c == center.pendant:
                room = 1
            low = fewest[c]
            supply += room
            forced += low
            bundle = bundle_of[c]
            if bundle == FREE:
                free += room
            elif bundle == SOLO:
                solo_forced += low
                solo_rooms += room - low
            else:
                card_room[bundle] = card_room.get(bundle, 0) + room
                if low:
                    card_forced.add(bundle)
        # Judged once every class at this reach is in.
        if (i == last or reaches[i + 1] != reach) and forced >= target.forced and supply >= target.devices:
            paid = solo_forced + len(card_forced)
            capacity = free + solo_forced + sum(card_room[card] for card in card_forced)
            meter.charge(len(card_room))
            if _enough(card_room, card_forced, solo_rooms, target.devices - capacity, target.bundles - paid):
                meter.record(i + 1)
                return reach
    meter.record(len(reaches))
    return None


def _enough(card_room: dict[int, int], card_forced: set[int], solo_rooms: int, need: int, opened: int) -> bool:
    """Whether opening `opened` more bundles (the largest cards, then devices with no card) covers `need`."""
    if need <= 0:
        return opened >= 0
    if opened <= 0:
        return False
    rooms = sorted((room for card, room in card_room.items() if card not in card_forced), reverse=True)[:opened]
    return sum(rooms) + min(solo_rooms, opened - len(rooms)) >= need


def _ball(center: Center, limits: Limits, diameter: int, meter: WorkMeter) -> Ball:
    meter.charge(len(center.classes))
    most = {}
    for reach, c in zip(center.reaches, center.classes, strict=True):
        if reach > diameter:
            break
        if limits.most[c]:
            most[c] = 1 if c == center.pendant else limits.most[c]
    return Ball(most)


def _widest(balls: list[Ball], meter: WorkMeter) -> list[Ball]:
    """The balls none of the others holds (of equal ones, the first)."""
    balls = sorted(balls, key=lambda ball: -sum(ball.most.values()))
    widest: list[Ball] = []
    for ball in balls:
        meter.charge(1 + len(widest) * len(ball.most))
        if not any(all(other.most.get(c, 0) >= room for c, room in ball.most.items()) for other in widest):
            widest.append(ball)
    return widest
