"""Cache pages and state slots for the engine.

Paged caches (the FP8 latent + indexer caches of the DSA layers) are cut into pages of `PAGE`
tokens; a sequence's block table lists its pages in position order and grows on demand, one page at
a time, as the sequence grows. The KDA state and conv state have one row per sequence (a slot),
taken when a sequence starts and given back when it finishes or is preempted.
"""
from __future__ import annotations

from k31dsl.dsl.errors import K31Error
from k31dsl.model.config import PAGE


def pages_for(n_tokens: int) -> int:
    """Pages that hold `n_tokens` tokens."""
    return -(-n_tokens // PAGE)


class PageAllocator:
    """A free list of `num_pages` cache pages (ids 0 .. num_pages-1)."""

    def __init__(self, num_pages: int):
        if not isinstance(num_pages, int) or num_pages < 1:
            raise K31Error(f"PageAllocator: num_pages must be an int >= 1, got {num_pages!r}")
        self.num_pages = num_pages
        # Popped from the end: the lowest ids go out first (easier to read in a debugger).
        self._free = list(range(num_pages - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def grow(self, table: list[int], n_tokens: int) -> bool:
        """Append pages to `table` until it holds `n_tokens` tokens. All or nothing: False (and
        `table` unchanged) when the free list is too short."""
        need = pages_for(n_tokens) - len(table)
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        for _ in range(need):
            page = self._free.pop()
            self._used.add(page)
            table.append(page)
        return True

    def free(self, table: list[int]) -> None:
        """Give back every page of `table` and empty it."""
        for page in table:
            if page not in self._used:
                raise K31Error(f"PageAllocator: page {page} freed twice or never allocated")
            self._used.remove(page)
            self._free.append(page)
        table.clear()


class SlotAllocator:
    """State-pool rows (KDA state + conv state), ids 0 .. num_slots-1."""

    def __init__(self, num_slots: int):
        if not isinstance(num_slots, int) or num_slots < 1:
            raise K31Error(f"SlotAllocator: num_slots must be an int >= 1, got {num_slots!r}")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int | None:
        """A free slot, or None when all are taken."""
        if not self._free:
            return None
        slot = self._free.pop()
        self._used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        if slot not in self._used:
            raise K31Error(f"SlotAllocator: slot {slot} freed twice or never allocated")
        self._used.remove(slot)
        self._free.append(slot)
