"""Quota accounting for one GPU type: usage, borrowing, lending and the free pool, by counts.

DESIGN §2, precise rules: at every admission the GPUs borrowed by all shares must not exceed the
free pool plus what lenders can lend. The ledger keeps both totals up to date so that checking an
admission costs only the shares it touches.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.engine import reasons
from scheduler.engine.snapshot import LEND_AND_BORROW, RESERVE, UNLIMITED, ShareView


def lend_limit_for(share: ShareView, gpu_type: str) -> int | None:
    """The share's lend_limit for this type; None: every idle GPU may be lent."""
    lend_limit = share.lend_limit
    if lend_limit is None:
        return None
    if isinstance(lend_limit, int):  # a plain number means the same for every type
        return lend_limit
    return lend_limit.get(gpu_type)


def borrow_cap_for(share: ShareView, gpu_type: str) -> int | None:
    """Extra GPUs the share may borrow on top of its limit; None: no cap beyond the cluster."""
    if share.strategy != LEND_AND_BORROW:
        return 0
    if share.borrow_limit == UNLIMITED:
        return None
    # DESIGN §2: borrow_limit GPUs are rounded down.
    return share.capacity_limits.get(gpu_type, 0) * share.borrow_limit // 100


class Ledger:
    """Usage per share of one GPU type and the two totals the borrowing rule compares.

    `usage` counts every placed job, stopping ones included, until a job waiting for a reclaim
    is committed: then its GPUs count for its share and its victims' no longer do, so that
    later jobs in the same plan see the quota as it will be once the victims have stopped.
    """

    def __init__(
        self,
        gpu_type: str,
        shares: Mapping[str, ShareView],
        usage: Mapping[str, int],
        capacity: int,
    ) -> None:
        self.gpu_type = gpu_type
        self._shares = shares
        self._limit = {name: s.capacity_limits.get(gpu_type, 0) for name, s in shares.items()}
        self._lend_limit = {name: lend_limit_for(s, gpu_type) for name, s in shares.items()}
        self._borrow_cap = {name: borrow_cap_for(s, gpu_type) for name, s in shares.items()}
        # Capacity not covered by any share's limit, DISABLED shares included: their quota still
        # exists and is still lent per their strategy.
        self.free_pool = max(0, capacity - sum(self._limit.values()))
        self._usage = {name: usage.get(name, 0) for name in shares}
        self.borrowed_total = sum(self._borrowed(name, u) for name, u in self._usage.items())
        self.lendable_total = sum(self._lendable(name, u) for name, u in self._usage.items())

    def limit(self, share: str) -> int:
        return self._limit[share]

    def usage(self, share: str) -> int:
        return self._usage[share]

    def borrowed(self, share: str) -> int:
        return self._borrowed(share, self._usage[share])

    def lendable(self, share: str) -> int:
        return self._lendable(share, self._usage[share])

    def above_limit(self, share: str) -> bool:
        return self._usage[share] > self._limit[share]

    def _borrowed(self, share: str, usage: int) -> int:
        return max(0, usage - self._limit[share])

    def _lendable(self, share: str, usage: int) -> int:
        if self._shares[share].strategy == RESERVE:
            return 0
        idle = max(0, self._limit[share] - usage)
        lend_limit = self._lend_limit[share]
        return idle if lend_limit is None else min(idle, lend_limit)

    def check(self, share: str, deltas: Mapping[str, int], within_limit: bool) -> str | None:
        """None if `share` may admit a job when usage changes by `deltas` (the job's GPUs for
        its share, minus victims'); else the reason it may not.

        `within_limit` (reclaim tries 1 and 3) also demands the share stays within its limit.
        """
        trial = self.trial(share, within_limit)
        for name, delta in deltas.items():
            trial.change(name, delta)
        return trial.reason()

    def trial(self, share: str, within_limit: bool) -> Trial:
        """A what-if on top of the ledger, changed one share at a time at constant cost."""
        return Trial(self, share, within_limit)

    def apply(self, deltas: Mapping[str, int]) -> None:
        """Record usage changes: an admitted job, or a committed reclaim and its victims."""
        for name, delta in deltas.items():
            if delta and name in self._usage:
                old = self._usage[name]
                new = old + delta
                self.borrowed_total += self._borrowed(name, new) - self._borrowed(name, old)
                self.lendable_total += self._lendable(name, new) - self._lendable(name, old)
                self._usage[name] = new


class Trial:
    """Usage changes being tried for one admission (the job, its victims), with the borrowed
    and lendable totals kept current so each check costs the same however many shares change."""

    def __init__(self, ledger: Ledger, share: str, within_limit: bool) -> None:
        self._ledger = ledger
        self._share = share
        self._within_limit = within_limit
        self.deltas: dict[str, int] = {}
        self._borrowed = ledger.borrowed_total
        self._lendable = ledger.lendable_total

    def change(self, name: str, delta: int) -> None:
        ledger = self._ledger
        if not delta or name not in ledger._usage:
            return
        base = ledger._usage[name]
        old = base + self.deltas.get(name, 0)
        new = old + delta
        self.deltas[name] = new - base
        self._borrowed += ledger._borrowed(name, new) - ledger._borrowed(name, old)
        self._lendable += ledger._lendable(name, new) - ledger._lendable(name, old)

    def usage(self, name: str) -> int:
        return self._ledger._usage[name] + self.deltas.get(name, 0)

    def reason(self) -> str | None:
        """None if the quota rules hold with these changes; else why not."""
        ledger = self._ledger
        share = self._share
        limit = ledger._limit[share]
        used = ledger._usage[share]
        after = used + self.deltas.get(share, 0)
        if after > limit:
            if self._within_limit or ledger._shares[share].strategy != LEND_AND_BORROW:
                return reasons.at_limit(share, used, limit, ledger.gpu_type)
            cap = ledger._borrow_cap[share]
            if cap is not None and after - limit > cap:
                return reasons.borrow_limit_reached(
                    ledger._borrowed(share, used), cap, ledger.gpu_type
                )
        if self._borrowed > ledger.free_pool + self._lendable:
            if after > limit:
                return reasons.no_lendable(ledger.gpu_type)
            return reasons.quota_lent_out(share, ledger.gpu_type)
        return None
