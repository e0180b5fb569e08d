"""Cache pages and state slots for the engine.

Paged caches (the FP8 latent + indexer caches of the DSA layers) are cut into pages of `PAGE`
tokens; a sequence's block table lists its pages in position order and grows on demand, one page at
a time, as the sequence grows. The KDA state and conv state have one row per sequence (a slot),
taken when a sequence starts and given back when it finishes or is preempted.
"""
from __future__ import annotations

from k31dsl.dsl.errors import K31Error
from k31dsl.model.config import pages_for


class _IdPool:
    """A free list of ids 0 .. count-1; the lowest ids go out first (easier to read in a debugger)."""

    def __init__(self, count: int, count_name: str, item: str):
        if not isinstance(count, int) or count < 1:
            raise K31Error(f"{type(self).__name__}: {count_name} must be an int >= 1, got {count!r}")
        self._item = item
        self._free = list(range(count - 1, -1, -1))       # popped from the end
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def _take(self) -> int:
        i = self._free.pop()
        self._used.add(i)
        return i

    def _give(self, i: int) -> None:
        if i not in self._used:
            raise K31Error(f"{type(self).__name__}: {self._item} {i} freed twice or never allocated")
        self._used.remove(i)
        self._free.append(i)


class PageAllocator(_IdPool):
    """A free list of `num_pages` cache pages (ids 0 .. num_pages-1)."""

    def __init__(self, num_pages: int):
        super().__init__(num_pages, "num_pages", "page")
        self.num_pages = num_pages

    def grow(self, table: list[int], n_tokens: int) -> bool:
        """Append pages to `table` until it holds `n_tokens` tokens. All or nothing: False (and
        `table` unchanged) when the free list is too short."""
        need = pages_for(n_tokens) - len(table)
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        table.extend(self._take() for _ in range(need))
        return True

    def free(self, table: list[int]) -> None:
        """Give back every page of `table` and empty it."""
        for page in table:
            self._give(page)
        table.clear()


class SlotAllocator(_IdPool):
    """State-pool rows (KDA state + conv state), ids 0 .. num_slots-1."""

    def __init__(self, num_slots: int):
        super().__init__(num_slots, "num_slots", "slot")
        self.num_slots = num_slots

    def allocate(self) -> int | None:
        """A free slot, or None when all are taken."""
        return self._take() if self._free else None

    def free(self, slot: int) -> None:
        self._give(slot)
