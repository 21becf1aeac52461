"""The bounded caches behind fp8lab.gpu: entries a captured CUDA graph uses are never evicted
(runs without a GPU: the capture predicate is injected)."""

from fp8lab.gpu._cache import BoundedCache


def test_evicts_when_full_and_keeps_captured_entries():
    capturing = [False]
    c = BoundedCache(3, capturing=lambda: capturing[0])
    c.put("a", 1)
    capturing[0] = True
    c.put("b", 2)            # made during capture: kept
    capturing[0] = False
    c.put("c", 3)
    assert len(c) == 3 and c.kept() == 1
    c.put("d", 4)            # full: everything not kept goes
    assert sorted(c.keys()) == ["b", "d"]
    assert c.get("b") == 2 and c.get("a") is None and c.get("a", 0) == 0


def test_an_entry_used_during_capture_is_kept():
    capturing = [False]
    c = BoundedCache(2, capturing=lambda: capturing[0])
    c.put("plan", "launches")
    capturing[0] = True
    assert c.get("plan") == "launches"   # a graph now holds what this entry points to
    capturing[0] = False
    for i in range(10):
        c.put(i, i)
    assert "plan" in c and c.get("plan") == "launches" and c.kept() == 1
    assert len(c) <= 2


def test_replacing_a_key_does_not_evict():
    c = BoundedCache(2, capturing=lambda: False)
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 3)            # same key: no eviction
    assert sorted(c.keys()) == ["a", "b"] and c.get("a") == 3


def test_many_kept_entries_never_evicted():
    c = BoundedCache(2, capturing=lambda: True)
    for i in range(5):
        c.put(i, i)
    assert len(c) == 5 and c.kept() == 5
    c.evict()
    assert len(c) == 5
