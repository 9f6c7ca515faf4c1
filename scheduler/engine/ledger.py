"""What may be admitted, for one GPU type: usage, borrowing, lending and the free pool, by counts
(the rules of each are in `accounting`).

DESIGN §2, precise rules: at every admission the GPUs borrowed by all shares must not exceed the
free pool plus what lenders can lend. The ledger keeps both totals up to date so that checking an
admission costs only the shares it touches.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.engine import accounting, reasons
from scheduler.engine.snapshot import LEND_AND_BORROW, ShareView


class Ledger:
    """Usage per share of one GPU type and the two totals the borrowing rule compares, in two
    states that every admission must respect:

    - `held`: the GPUs jobs hold now. Stopping jobs count until they have stopped (DESIGN §2:
      usage includes jobs still stopping), so a victim's quota is not handed to anyone else
      during its grace period;
    - `planned`: as it will be once the victims have stopped. A job waiting for a reclaim (or
      for GPUs being released) counts for its share, and its victims no longer count, so later
      jobs in the same plan cannot take what was promised to it.

    Both start as the snapshot's usage; a placement changes both, a committed wait only
    `planned`.
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
        self._limit: dict[str, int] = {}
        self._borrow_cap: dict[str, int | None] = {}
        # How many idle GPUs of each share may be lent at most (no cap: its whole limit).
        self._lend_cap: dict[str, int] = {}
        # The shares' usage and the borrowed and lendable totals, in the same pass (a ledger is
        # set up for every GPU type of every plan).
        used_by: dict[str, int] = {}
        borrowed = lendable = 0
        for name, share in shares.items():
            limit = self._limit[name] = share.capacity_limits.get(gpu_type, 0)
            self._borrow_cap[name] = accounting.borrow_cap_for(share, gpu_type)
            cap = self._lend_cap[name] = accounting.lend_cap(share, gpu_type)
            used = used_by[name] = usage.get(name, 0)
            if used > limit:
                borrowed += used - limit
            elif used < limit:
                lendable += accounting.lendable(limit, used, cap)
        # Capacity not covered by any share's limit, DISABLED shares included: their quota still
        # exists and is still lent per their strategy.
        self.free_pool = max(0, capacity - sum(self._limit.values()))
        self.planned = _State(used_by, borrowed, lendable)
        self.held = self.planned.copy()

    def limit(self, share: str) -> int:
        return self._limit[share]

    @property
    def limits(self) -> Mapping[str, int]:
        """Every share's limit for this type, by name."""
        return self._limit

    def usage(self, share: str) -> int:
        """The share's usage as planned: once the victims of this plan have stopped."""
        return self.planned.usage[share]

    def held_usage(self, share: str) -> int:
        """The GPUs the share's jobs hold now, stopping ones included."""
        return self.held.usage[share]

    def borrowed(self, share: str) -> int:
        return self._borrowed(share, self.planned.usage[share])

    def above_limit(self, share: str) -> bool:
        return self.planned.usage[share] > self._limit[share]

    def fits_limit(self, share: str, gpus: int) -> bool:
        """Whether `gpus` more keep the share within its limit, now and once victims stopped."""
        limit = self._limit[share]
        return self.planned.usage[share] + gpus <= limit and self.held.usage[share] + gpus <= limit

    def usage_cap(self, share: str, within_limit: bool) -> int | None:
        """The most GPUs the share may use after an admission (its limit, or its limit plus its
        borrow cap); None: no cap beyond the cluster."""
        limit = self._limit[share]
        if within_limit or self._shares[share].strategy != LEND_AND_BORROW:
            return limit
        cap = self._borrow_cap[share]
        return None if cap is None else limit + cap

    def _borrowed(self, share: str, usage: int) -> int:
        return max(0, usage - self._limit[share])

    def _lendable(self, share: str, usage: int) -> int:
        return accounting.lendable(self._limit[share], usage, self._lend_cap[share])

    def check(self, share: str, deltas: Mapping[str, int], within_limit: bool) -> str | None:
        """None if `share` may admit a job when usage changes by `deltas` (the job's GPUs for
        its share, minus victims'); else the reason it may not.

        `within_limit` (reclaim tries 1 and 3) also demands the share stays within its limit.
        """
        trial = self.trial(share, within_limit)
        for name, delta in deltas.items():
            trial.change(name, delta)
        return trial.reason()

    def admission_reason(self, share: str, gpus: int) -> str | None:
        """`check(share, {share: gpus}, within_limit=False)` for the common case of one job and
        no victims, without building a trial: it runs for every runnable job of every plan."""
        if not gpus:
            return None
        limit = self._limit[share]
        cap = self._lend_cap[share]
        for state in (self.planned, self.held):
            used = state.usage[share]
            after = used + gpus
            if after > limit:
                if self._shares[share].strategy != LEND_AND_BORROW:
                    return reasons.at_limit(share, used, limit, self.gpu_type)
                borrow_cap = self._borrow_cap[share]
                if borrow_cap is not None and after - limit > borrow_cap:
                    return reasons.borrow_limit_reached(
                        self._borrowed(share, used), borrow_cap, self.gpu_type
                    )
            # Borrowed minus lendable, with accounting.lendable inlined (this runs for every
            # runnable job of every plan).
            excess = (
                state.borrowed_total
                - state.lendable_total
                + (after - limit if after >= limit else -min(limit - after, cap))
                - (used - limit if used >= limit else -min(limit - used, cap))
            )
            if excess > self.free_pool:
                if after > limit:
                    return reasons.no_lendable(self.gpu_type)
                return reasons.quota_lent_out(share, self.gpu_type)
        return None

    def trial(self, share: str, within_limit: bool) -> Trial:
        """A what-if on top of the ledger, changed one share at a time at constant cost."""
        return Trial(self, share, within_limit)

    def admit(self, deltas: Mapping[str, int]) -> None:
        """Record a placement: its GPUs are held now and stay held."""
        self.held.apply(deltas, self)
        self.planned.apply(deltas, self)

    def promise(self, deltas: Mapping[str, int]) -> None:
        """Record a committed wait: the job and its victims' release, once the victims stop."""
        self.planned.apply(deltas, self)


class _State:
    """Usage per share and the borrowed and lendable totals, in one of the ledger's states."""

    def __init__(self, usage: dict[str, int], borrowed_total: int, lendable_total: int) -> None:
        self.usage = usage
        self.borrowed_total = borrowed_total
        self.lendable_total = lendable_total

    def copy(self) -> _State:
        return _State(dict(self.usage), self.borrowed_total, self.lendable_total)

    def apply(self, deltas: Mapping[str, int], ledger: Ledger) -> None:
        for name, delta in deltas.items():
            if delta and name in self.usage:
                old = self.usage[name]
                new = old + delta
                self.borrowed_total += ledger._borrowed(name, new) - ledger._borrowed(name, old)
                self.lendable_total += ledger._lendable(name, new) - ledger._lendable(name, old)
                self.usage[name] = new


class Trial:
    """Usage changes being tried for one admission (the job, its victims), with the borrowed
    and lendable totals of both ledger states kept current, so each check costs the same
    however many shares change."""

    def __init__(self, ledger: Ledger, share: str, within_limit: bool) -> None:
        self._ledger = ledger
        self._share = share
        self._within_limit = within_limit
        self.deltas: dict[str, int] = {}
        # Borrowed minus lendable, as planned and as held now: the borrowing rule holds while
        # it is at most the free pool.
        self._planned = ledger.planned.borrowed_total - ledger.planned.lendable_total
        self._held = ledger.held.borrowed_total - ledger.held.lendable_total

    def change(self, name: str, delta: int) -> None:
        ledger = self._ledger
        limit = ledger._limit.get(name)
        if not delta or limit is None:
            return
        cap = ledger._lend_cap[name]
        before = self.deltas.get(name, 0)
        self.deltas[name] = before + delta
        # Borrowed minus lendable of one share at usage u: u - limit above the limit, else
        # minus its lendable idle GPUs.
        old = ledger.planned.usage[name] + before
        new = old + delta
        self._planned += (new - limit if new >= limit else -min(limit - new, cap)) - (
            old - limit if old >= limit else -min(limit - old, cap)
        )
        old = ledger.held.usage[name] + before
        new = old + delta
        self._held += (new - limit if new >= limit else -min(limit - new, cap)) - (
            old - limit if old >= limit else -min(limit - old, cap)
        )

    def usage(self, name: str) -> int:
        """The share's planned usage with these changes."""
        return self._ledger.planned.usage[name] + self.deltas.get(name, 0)

    def reason(self) -> str | None:
        """None if the quota rules hold with these changes, as planned and as held now; else
        why not."""
        ledger = self._ledger
        return self._reason(ledger.planned, self._planned) or self._reason(ledger.held, self._held)

    def _reason(self, state: _State, excess: int) -> str | None:
        ledger = self._ledger
        share = self._share
        limit = ledger._limit[share]
        used = state.usage[share]
        after = used + self.deltas.get(share, 0)
        if after > limit:
            if self._within_limit or ledger._shares[share].strategy != LEND_AND_BORROW:
                return reasons.at_limit(share, used, limit, ledger.gpu_type)
            cap = ledger._borrow_cap[share]
            if cap is not None and after - limit > cap:
                return reasons.borrow_limit_reached(
                    ledger._borrowed(share, used), cap, ledger.gpu_type
                )
        if excess > ledger.free_pool:
            if after > limit:
                return reasons.no_lendable(ledger.gpu_type)
            return reasons.quota_lent_out(share, ledger.gpu_type)
        return None
