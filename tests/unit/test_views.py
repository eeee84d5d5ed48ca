from __future__ import annotations

from datetime import datetime, timedelta, timezone

from api.views import eta_seconds, percent_done


def test_percent_counts_batches_across_epochs() -> None:
    assert percent_done(epoch=1, batch=0, batches_per_epoch=10, epochs=2) == 0.0
    assert percent_done(epoch=1, batch=10, batches_per_epoch=10, epochs=2) == 50.0
    assert percent_done(epoch=2, batch=5, batches_per_epoch=10, epochs=2) == 75.0
    assert percent_done(epoch=2, batch=10, batches_per_epoch=10, epochs=2) == 100.0


def test_percent_never_leaves_0_to_100() -> None:
    assert percent_done(epoch=3, batch=10, batches_per_epoch=10, epochs=2) == 100.0


def test_eta_is_the_pace_so_far_counted_down_since_the_report() -> None:
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    report = start + timedelta(seconds=10)
    # 25% in 10 s: 30 s left at the report, 26 s four seconds later.
    assert eta_seconds(percent=25.0, started_at=start, reported_at=report, now=report) == 30.0
    later = report + timedelta(seconds=4)
    assert eta_seconds(percent=25.0, started_at=start, reported_at=report, now=later) == 26.0
    much_later = report + timedelta(seconds=100)
    assert eta_seconds(percent=25.0, started_at=start, reported_at=report, now=much_later) == 0.0
    assert eta_seconds(percent=0.0, started_at=start, reported_at=report, now=report) is None
    assert eta_seconds(percent=50.0, started_at=None, reported_at=report, now=report) is None
