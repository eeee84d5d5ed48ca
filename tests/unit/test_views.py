from __future__ import annotations

from api.views import percent_done


def test_percent_counts_batches_across_epochs() -> None:
    assert percent_done(epoch=1, batch=0, batches_per_epoch=10, epochs=2) == 0.0
    assert percent_done(epoch=1, batch=10, batches_per_epoch=10, epochs=2) == 50.0
    assert percent_done(epoch=2, batch=5, batches_per_epoch=10, epochs=2) == 75.0
    assert percent_done(epoch=2, batch=10, batches_per_epoch=10, epochs=2) == 100.0


def test_percent_never_leaves_0_to_100() -> None:
    assert percent_done(epoch=3, batch=10, batches_per_epoch=10, epochs=2) == 100.0
