"""The one bound on request IDs in errors and logs: short whatever the request, exact for ordinary IDs."""

import random

from shared.observability.hostile_ids import (
    LISTED_IN_ERROR,
    LOGGED_CHARS,
    LOGGED_IDS,
    QUOTED_CHARS,
    listed,
    logged,
    quoted,
)


def test_an_ordinary_id_is_quoted_whole_and_a_long_one_is_cut_with_a_mark():
    assert quoted("rbln0") == "'rbln0'"
    long = "\n" * 10_000
    assert quoted(long) == repr(long)[:QUOTED_CHARS] + "…"


def test_a_list_names_the_first_few_and_counts_the_rest():
    assert listed(["a", "b"]) == "a, b"
    assert listed([f"d{i}" for i in range(LISTED_IN_ERROR + 3)]) == "d0, d1, d2, d3, d4 and 3 more"
    assert listed(["x" * 200], quote=True) == "'" + "x" * (QUOTED_CHARS - 1) + "…"


def test_hostile_lists_stay_bounded_in_every_form():
    rng = random.Random(25)
    for _ in range(50):
        ids = ["".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(0, 3000)))
               for _ in range(rng.randrange(0, 400))]
        assert len(listed(ids, quote=True)) <= LISTED_IN_ERROR * (QUOTED_CHARS + 3) + 30
        bounded = logged(ids)
        assert len(bounded) == min(len(ids), LOGGED_IDS)
        assert all(len(i) <= LOGGED_CHARS and ids[n].startswith(i) for n, i in enumerate(bounded))
