"""How many shards a fit's parameter server has: a decision over numbers, and the cases that allow only one.

:func:`decide_shards` is the decision (``SparkModel(ps_shards=)`` wins, else
:func:`elephant.ps.shards.choose_shards` over the model's bytes, the workers
and the estimated seconds between a worker's commits); :func:`shard_blocker`
names what keeps a fit on one shard (``norm_guard``, a rule that is not
elementwise), and :func:`check_requested_shards` refuses an explicit
``ps_shards > 1`` there, and more shards than workers where the workers' tasks
host them (a Spark Connect fit).
:func:`elephant.fit.plan.plan_fit` records the outcome as a :class:`ShardChoice`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from elephant.config import Settings
from elephant.errors import ConfigError

__all__ = ["ShardChoice", "check_requested_shards", "decide_shards", "shard_blocker"]


def shard_blocker(settings: Settings) -> str | None:
    """Why the fit's parameter server cannot be sharded (None: it can)."""
    if settings.norm_guard is not None:
        return f"norm_guard={settings.norm_guard:g} judges a commit's norm over all its tensors"
    if not settings.optimizer.elementwise:
        return f"{type(settings.optimizer).__name__}'s server rule is not declared elementwise"
    return None


def check_requested_shards(settings: Settings, hosted_by: int | None = None) -> None:
    """Refuse ``ps_shards > 1`` where the server cannot be sharded (see :func:`shard_blocker`).

    ``hosted_by``: the number of workers whose tasks host the shards, one each (a
    Spark Connect fit), or None where the driver hosts them.

    Raises:
        ConfigError: the reason, and the ``ps_shards`` received.
    """
    if settings.ps_shards is None or settings.ps_shards == 1:
        return
    if hosted_by is not None and settings.ps_shards > hosted_by:
        raise ConfigError(f"`ps_shards` must be at most num_workers={hosted_by} under Spark Connect, where each "
                          f"shard is served by one of an epoch's worker tasks; received ps_shards={settings.ps_shards}")
    from elephant.ps.shard_client import check_shardable

    try:
        check_shardable(settings.optimizer, settings.norm_guard)
    except ConfigError as exc:
        raise ConfigError(f"`ps_shards` must be 1 or None here: {exc}; received ps_shards={settings.ps_shards}") from None


def decide_shards(requested: int | None, model_bytes: int, num_workers: int, commit_interval: float,
                  blocked: str | None = None, hosted: bool = False) -> int:
    """How many parameter-server shards serve a fit: ``requested`` (``SparkModel(ps_shards=)``) wins;
    else 1 where ``blocked`` says why shards cannot serve it; else
    :func:`~elephant.ps.shards.choose_shards` over the model's bytes, the workers and the seconds
    between two commits of one worker (1 for small models), at most one per worker where the
    workers' tasks host them (``hosted``). A request rate that one process
    cannot serve is logged at INFO, not warned about: shards do not change it, and the
    window that sets it is the user's or the window decision's."""
    if requested is not None:
        return requested
    if blocked:
        return 1
    from elephant.ps.shards import choose_shards

    chosen = choose_shards(model_bytes, num_workers, commit_interval, warn_requests=False)
    return min(chosen, num_workers) if hosted else chosen


@dataclasses.dataclass(frozen=True)
class ShardChoice:
    """How many shards a fit's parameter server has, with the decision's inputs (logged, in ``fit_plan``).

    Attributes:
        shards: ``S``; requested: ``SparkModel(ps_shards=)`` (None: decided);
        model_bytes, num_workers: the model's bytes and the workers;
        commit_interval: the estimated seconds between two commits of one worker
            (the window's steps at the estimated step cost, plus a commit);
        blocked: why the server cannot be sharded, or None.
    """

    shards: int
    requested: int | None
    model_bytes: int
    num_workers: int
    commit_interval: float
    blocked: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        if self.requested is not None:
            how = f"ps_shards={self.requested} given"
        elif self.blocked:
            how = f"one shard: {self.blocked}"
        else:
            how = "decided by choose_shards"
        return (f"{self.shards} parameter-server shard(s) ({how}) for {self.model_bytes / 1e6:.2f} MB of weights, "
                f"{self.num_workers} workers committing every ~{self.commit_interval:.3g} s (estimated); "
                "SparkModel(ps_shards=) fixes it")
