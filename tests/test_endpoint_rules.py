"""``_endpoint._rules.Retention``: the finished jobs the local endpoint keeps, and its
memory of their expiries bounded by the count rule (docs/protocol.md §4.1; the rule through
the endpoint's routes is in tests/test_local_endpoint.py)."""

from __future__ import annotations

from trio_worker._endpoint._rules import Retention


def test_retention_prunes_entries_the_count_rule_dropped() -> None:
    retention = Retention(max_count=2)
    for n in range(1000):
        assert retention.add(f"j{n}", 100.0 + n) == ([f"j{n - 2}"] if n >= 2 else [])
        assert retention.due(0.0) == []
    assert len(retention._expiries) <= 2 * 2 + 64
    assert retention.due(5000.0) == ["j998", "j999"]
