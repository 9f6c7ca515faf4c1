"""Who owns, borrows and lends how many GPUs of a type: DESIGN §2's accounting by counts.

The rules every part reports by, in one place: the planner's ledger (what may be admitted),
the live usage the API and the dashboards show (`shares.selectors.share_usage`) and the
simulator's GPU-hours borrowed and lent.

- A share `owns` what it uses up to its limit and `borrows` what it uses above it.
- What it can lend: its idle quota (limit − usage), within its `lend_limit`; a RESERVE share
  lends nothing.
- What borrowers use is drawn first on the free pool (capacity no share's limit covers), then on
  the lenders in proportion to what each can lend: that is what each of them has `lent`.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.engine.snapshot import LEND_AND_BORROW, RESERVE, UNLIMITED, ShareView


def lend_cap(share: ShareView, gpu_type: str) -> int:
    """The most idle GPUs of this type the share lends: none for RESERVE, else its lend_limit,
    else its whole limit."""
    if share.strategy == RESERVE:
        return 0
    lend_limit = share.lend_limit
    if lend_limit is not None and not isinstance(lend_limit, int):
        lend_limit = lend_limit.get(gpu_type)  # a plain number: the same for every type
    return share.capacity_limits.get(gpu_type, 0) if lend_limit is None else lend_limit


def borrow_cap_for(share: ShareView, gpu_type: str) -> int | None:
    """Extra GPUs the share may borrow on top of its limit; None: no cap beyond the cluster."""
    if share.strategy != LEND_AND_BORROW:
        return 0
    if share.borrow_limit == UNLIMITED:
        return None
    # DESIGN §2: borrow_limit GPUs are rounded down.
    return share.capacity_limits.get(gpu_type, 0) * share.borrow_limit // 100


def lendable(limit: int, usage: int, cap: int) -> int:
    """Idle GPUs a share with this limit, usage and lend cap (`lend_cap`) can lend."""
    idle = limit - usage
    if idle <= 0:
        return 0
    return idle if idle < cap else cap


def split_lent(borrowed: int, free_pool: int, can_lend: Mapping[str, int]) -> dict[str, float]:
    """How much of `borrowed` (all borrowers' GPUs of one type) each lender has lent: the free
    pool first, the rest in proportion to what each can lend (`can_lend`), never more than that.
    Exact shares, in GPUs; lenders that lent nothing are left out."""
    from_lenders = borrowed - min(borrowed, free_pool)
    total = sum(can_lend.values())
    if from_lenders <= 0 or total <= 0:
        return {}
    taken = min(from_lenders, total)
    return {name: taken * idle / total for name, idle in can_lend.items() if idle}


def in_whole_gpus(lent: Mapping[str, float]) -> dict[str, int]:
    """`split_lent`'s shares in whole GPUs, adding up to the same total, by the largest
    remainder (ties by name)."""
    whole = {name: int(value) for name, value in lent.items()}
    left = round(sum(lent.values())) - sum(whole.values())
    for name in sorted(lent, key=lambda n: (whole[n] - lent[n], n))[:left]:
        whole[name] += 1
    return whole
