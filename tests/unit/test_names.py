"""bulldozer.names: the "did you mean" every refusal of a name offers, from one rule."""

from __future__ import annotations

from bulldozer.names import closest, did_you_mean


def test_the_closest_known_name_is_offered() -> None:
    assert closest("ratng", ["rating", "price"]) == "rating"
    assert closest("zzz", ["rating", "price"]) is None
    assert did_you_mean("ratng", ["rating", "price"]) == "did you mean 'rating'?"
    assert did_you_mean("zzz", ["rating"]) == ""
    assert closest("BATCH", ["BATCH_SIZE", "HOME"], cutoff=0.75) is None  # a stricter cutoff


def test_without_case_the_known_spelling_is_offered() -> None:
    zones = ["Europe/Berlin", "America/New_York", "UTC"]
    assert closest("europe/berlin", zones, fold_case=True) == "Europe/Berlin"
    assert closest("Score", ["score", "scores"], fold_case=True) == "score"  # case alone beats a letter more
