"""The distributed-optimizer interface: the base class of every rule, and the checks on a rule as it runs.

One algorithm is one subclass of :class:`DistributedOptimizer` holding two pure
rules over lists of numpy arrays and explicit, picklable state:

* the **worker rule** says what a worker sends after a window of local steps
  (:meth:`~DistributedOptimizer.make_commit`) and how it merges the server's
  reply (:meth:`~DistributedOptimizer.on_reply`);
* the **server rule** says how the parameter server applies one commit
  (:meth:`~DistributedOptimizer.apply`, asynchronous modes) or one synchronous
  round of commits (:meth:`~DistributedOptimizer.apply_round`).

Everything else -- locks, clocks, barriers, staleness admission (SSP), I/O,
idempotency and the partial-window flush -- belongs to the runtime (the PS
store, the worker loop and :class:`elephant.SparkModel`), so a rule is plain
math that can be tested with exact numbers.

Sign convention: a delta is ``after - before`` and the server *adds* it.

The registry and ``get()`` are in :mod:`~elephant.optimizers.registry`; the helpers the
rules share (:func:`~elephant.optimizers.helpers.check_number`,
:func:`~elephant.optimizers.helpers.tree_map`, ...) in :mod:`~elephant.optimizers.helpers`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from elephant import weights as W
from elephant.errors import ConfigError
from elephant.optimizers.helpers import AVERAGING_SECTION, CONVERGENCE_DOCS, NAMED_RULES_SECTION, Weights, see_docs
from elephant.protocol import Commit, Reply

__all__ = [
    "Commit",
    "Reply",
    "DistributedOptimizer",
    "check_overlap",
    "worker_batch_size",
]


def _check_window(window: Any) -> int:
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ConfigError(f"`window` must be a positive int; received window={window!r}")
    return int(window)


def _check_staleness_bound(bound: Any) -> int | None:
    if bound is None:
        return None
    if isinstance(bound, bool) or not isinstance(bound, (int, np.integer)) or bound < 0:
        raise ConfigError(f"`staleness_bound` must be None or an int >= 0; received staleness_bound={bound!r}")
    return int(bound)


class DistributedOptimizer:
    """Base class of every distributed optimizer.

    Subclasses set ``name``, ``modes`` and ``default_window`` (and optionally
    ``aliases``) and override the rules they change. The defaults implement a
    DOWNPOUR-style delta exchange: the worker sends ``weights - pulled`` and
    adopts the center it gets back.

    Rules are pure: they never mutate their arguments (the arrays of a center,
    a commit or a state) and return new values and a new state. States must be
    picklable (plain containers of numpy arrays and numbers).

    Args:
        window: local steps per commit. Defaults to the class's ``default_window``
            (None there: one commit per partition pass).
            ``SparkModel(frequency=...)`` overrides it.
        staleness_bound: Stale Synchronous Parallel bound ``s`` for asynchronous
            modes: a worker may start a window only when it is at most ``s``
            commits ahead of the slowest active worker. ``None`` (default) means
            unbounded (plain asynchronous). Rejected for rules that only
            support synchronous mode, where it would mean nothing.

    Raises:
        ConfigError: an argument is out of range.
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    modes: ClassVar[tuple[str, ...]] = ("asynchronous", "hogwild")
    #: Local steps per commit when neither ``window`` nor ``SparkModel(frequency=...)``
    #: says otherwise; None means one commit per partition pass (``frequency="epoch"``).
    default_window: ClassVar[int | None] = 1
    #: True for rules whose center moves by about the *mean* of the workers' progress
    #: (averaging, elastic averaging). ``SparkModel`` then splits the user's batch
    #: across the workers by default, so that all workers together take as many
    #: optimizer steps per epoch as ``model.fit`` does (see :func:`worker_batch_size`).
    #: Rules that add every delta whole (DOWNPOUR) keep the full batch per worker.
    splits_batch: ClassVar[bool] = False
    #: For an asynchronous rule that averages the workers' progress without an outer
    #: step: where it falls short of plain training at 4 workers with the batch split, in
    #: words (which workloads, which local optimizers), named by :meth:`setup_warning` from
    #: 4 workers on. None: no such warning.
    averaging_shortfall: ClassVar[str | None] = None
    #: The docs section that holds the figures behind ``averaging_shortfall``, as the
    #: warning names it: ``docs/<page>.md, "<section title>"``.
    averaging_figures: ClassVar[str] = f'{CONVERGENCE_DOCS}, "{NAMED_RULES_SECTION}"'
    #: Whether a worker may train on while its commit is in flight (asynchronous modes):
    #: the runtime then applies :meth:`on_reply` to the weights as they were sent and adds
    #: the local progress made meanwhile. A rule that needs each reply before the next
    #: local step sets False and runs blocking.
    overlaps: ClassVar[bool] = True
    #: Whether the rule reduces a synchronous round as its commits arrive
    #: (:meth:`round_begin`, :meth:`round_add`, :meth:`round_end`): the server then
    #: keeps one accumulator per round instead of every partition's commit until the
    #: round closes, so its memory is about one model, not one per partition.
    streams_rounds: ClassVar[bool] = False
    #: For a rule whose window ``SparkModel`` decides at fit start from the model's size
    #: and the costs of a step and a commit (``docs/convergence.md``, "big models, big
    #: data, many workers") when the rule runs at its default window and no
    #: ``frequency`` is given: the least window the decision gives. None: the rule
    #: keeps its window. A rule whose default is one commit per pass keeps that on
    #: passes shorter than two such windows.
    window_from_costs: ClassVar[int | None] = None
    #: Whether the server rule treats every element of the tensors on its own: it never
    #: reduces over elements or tensors (no global norm or mean), and the scalars it uses
    #: come from the commit's counts, the clock, the number of workers or its hyper-parameters.
    #: A sharded parameter server (:mod:`elephant.ps.shard_client`) then applies it to
    #: slices of the tensors and gets the bytes one store gets; it refuses a rule without
    #: it. A subclass that overrides a server rule inherits the flag: reset it if the new
    #: rule reduces over the tensors.
    elementwise: ClassVar[bool] = False
    #: The codec (:class:`~elephant.optimizers.codecs.Codec`) in which a synchronous
    #: round's reply travels as the change of the workers' view of the center
    #: (:class:`~elephant.protocol.ReplyChange`); None (every rule but
    #: ``Compressed(replies=True)``): replies carry the dense center.
    reply_codec: ClassVar[Any] = None

    def __init__(self, window: int | None = None, staleness_bound: int | None = None):
        self._window_given = window is not None  # a window the user chose is never re-decided, even the default's
        if window is None and self.default_window is None:
            self.window: int | None = None  # one commit per partition pass
        else:
            self.window = _check_window(self.default_window if window is None else window)
        self.staleness_bound = _check_staleness_bound(staleness_bound)
        if self.staleness_bound is not None and not set(self.modes) - {"synchronous"}:
            raise ConfigError(
                f"`staleness_bound` applies to asynchronous modes only and {type(self).__name__} "
                f"supports {self.modes}; received staleness_bound={staleness_bound!r}"
            )

    # ----------------------------------------------------------------- worker
    def worker_init(self, center: Weights) -> Any:
        """Worker-rule state at the start of a partition (default: none)."""
        return None

    def make_commit(self, state: Any, weights: Weights, pulled: Weights, num_steps: int) -> tuple[Weights, Any]:
        """Payload sent after ``num_steps`` local steps from ``pulled`` to ``weights``."""
        return W.sub(weights, pulled), state

    def on_reply(self, state: Any, weights: Weights, reply: Reply) -> tuple[Weights, Any]:
        """Local weights after the server's reply (default: adopt the center)."""
        return reply.center, state

    def commit_template(self, template: Weights) -> Weights:
        """Arrays with the shapes and dtypes of this rule's commit payload for weights like ``template``.

        The runtime checks every commit against it (the simulator, the PS store
        and the wire decoder). Default: ``template`` itself, a payload shaped
        like the weights; a rule that sends something else (an encoded payload,
        :class:`~elephant.optimizers.compress.Compressed`) returns its layout.
        """
        return list(template)

    # ----------------------------------------------------------------- server
    def server_init(self, center: Weights, num_workers: int) -> Any:
        """Server-rule state at the start of a fit (default: none)."""
        return None

    def on_pull(self, state: Any, center: Weights, clock: int, worker: int) -> Any:
        """Server-rule state after ``worker`` pulled ``center`` (default: unchanged)."""
        return state

    def on_learning_rate_change(self, state: Any, ratio: float) -> Any:
        """Server-rule state after the user's learning rate was multiplied by ``ratio`` between epochs.

        A callback (``LearningRateScheduler``, ``ReduceLROnPlateau``) changed the
        compiled optimizer's rate on the driver; the workers train with the new
        rate from the next epoch. A rule that keeps a velocity of past deltas on
        the server should scale it by ``ratio`` (the momentum correction of Goyal
        et al., 2017), so that a rate of 0 stops the center as it stops the
        workers. Default: unchanged.
        """
        return state

    def apply(
        self, state: Any, center: Weights, clock: int, worker: int, commit: Commit
    ) -> tuple[Weights, Weights | None, Any]:
        """Apply one asynchronous commit: ``(new_center, reply_tensors, new_state)``."""
        raise NotImplementedError(f"{type(self).__name__} has no asynchronous server rule")

    def apply_round(
        self, state: Any, center: Weights, clock: int, commits: Mapping[int, Commit]
    ) -> tuple[Weights, Mapping[int, Weights | None], Any]:
        """Apply one synchronous round (worker index -> commit).

        Returns ``(new_center, reply_tensors_by_worker, new_state)``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no synchronous server rule")

    def round_begin(self, num_workers: int) -> Any:
        """A streaming rule's empty accumulator for a synchronous round (``streams_rounds``)."""
        raise NotImplementedError(f"{type(self).__name__} does not stream rounds")

    def round_add(self, acc: Any, worker: int, commit: Commit) -> Any:
        """The accumulator after ``worker``'s commit; it may update ``acc`` in place (the
        round owns it), never the commit."""
        raise NotImplementedError(f"{type(self).__name__} does not stream rounds")

    def round_end(
        self, state: Any, center: Weights, clock: int, acc: Any, workers: Sequence[int]
    ) -> tuple[Weights, Mapping[int, Weights | None], Any]:
        """Close a streamed round of ``workers``: ``(new_center, reply_tensors_by_worker, new_state)``,
        as :meth:`apply_round` returns them."""
        raise NotImplementedError(f"{type(self).__name__} does not stream rounds")

    def local_optimizer_mismatch(self, local: Any) -> str | None:
        """Why the model's compiled Keras optimizer breaks an assumption of this rule, or None.

        ``SparkModel`` logs the answer as a warning. Rules whose math assumes a
        particular local optimizer (DC-ASGD: plain SGD with this rule's
        learning rate; EAMSGD: Nesterov SGD with this rule's momentum) override
        it; ``local`` is duck-typed, so this package needs no Keras import.
        """
        return None

    def setup_warning(self, window: int | None, num_workers: int, batch_split: bool) -> str | None:
        """Why this rule, run with ``window`` (None: one commit per pass), ``num_workers``
        workers and the batch split on or off, is known to fall short of plain training,
        or None. ``SparkModel.fit`` logs the answer as a warning at the start of the fit.

        The base class warns when an averaging rule (``splits_batch``) runs with full
        batches per worker, and names ``averaging_shortfall`` from 4 workers on. Rules
        override it to add their own cases (and call ``super()``): each warning says what
        is risky and what to do, and ends with the docs section that holds the figures
        (:func:`see_docs`), never the figures themselves.
        """
        if self.splits_batch and not batch_split and num_workers > 1:
            return (
                f"{type(self).__name__} moves the center by about the mean of the workers' progress, and with "
                f"batch_split=False each of the {num_workers} workers takes 1/{num_workers} of plain training's "
                "steps per epoch, so the center falls behind model.fit at equal epochs, further with more workers. "
                "Keep the default batch split (SparkModel(batch_split=None)) unless you scale the epochs "
                f"{see_docs(AVERAGING_SECTION)}."
            )
        if self.averaging_shortfall and self.splits_batch and batch_split and num_workers >= 4:
            return (
                f"{type(self).__name__} with {num_workers} workers averages the workers' progress without an outer "
                "momentum step, and with the batch split among them it falls behind plain training at equal epochs "
                f"({self.averaging_shortfall}). For parity use the asynchronous default (optimizer=None: "
                f"DelayedNesterov, one commit per pass) or train more epochs (see {self.averaging_figures})."
            )
        return None

    @property
    def adapts_window(self) -> bool:
        """Whether a fit decides this rule's window from its costs (see :attr:`window_from_costs`)."""
        given = getattr(self, "_window_given", None)
        if given is None:  # a subclass that set its window without DistributedOptimizer.__init__
            given = self.window != self.default_window
        return self.window_from_costs is not None and not given

    def for_fit(self, local: Any, num_workers: int, batch_split: bool, window: int | None) -> DistributedOptimizer:
        """This rule as it will run in one fit: settings left to "auto" resolved.

        ``SparkModel.fit`` and :func:`~elephant.optimizers.simulate_fit` call it at
        the start of a fit with the model's compiled Keras optimizer (``local``,
        duck-typed), the number of workers, whether the batch is split and the
        fit's window (None: one commit per pass), and run the rule it returns (on
        the server and in every worker). Rules whose
        default depends on these (AGN's square-root step scaling, say) return a
        resolved copy; the base class returns ``self``. Never mutate ``self``.
        """
        return self

    def local_rate_scale(self, local: Any, num_workers: int, batch_split: bool) -> float:
        """The factor on the compiled learning rate this rule's workers train with in a fit (1: as compiled).

        Called on the rule :meth:`for_fit` returned, with the same arguments;
        the averaging defaults give ``√K`` for an adaptive optimizer on the
        split batch (:class:`~elephant.optimizers.local.ScaledLocalRate`).
        """
        return 1.0

    def local_rate_warmup(self, local: Any, num_workers: int, batch_split: bool) -> bool:
        """Whether the workers ramp that factor up from 1 over the fit's first epoch (False: it holds from the
        first step); the averaging defaults ramp a factor above 2."""
        return False

    def local_moment(self, local: Any, num_workers: int, batch_split: bool) -> Any:
        """How this rule's workers change their adaptive optimizer's second-moment decay in a fit, as a
        :class:`~elephant.optimizers.local.LocalMoment`, or None (default): as compiled. The averaging
        defaults spread it over ``K`` times the steps where they scale the rate."""
        return None

    def local_momentum(self, local: Any, num_workers: int, batch_split: bool, window: int | None) -> Any:
        """How this rule's workers change their adaptive optimizer's running mean of the gradient in a fit that
        commits every ``window`` steps (None: once per pass), as a
        :class:`~elephant.optimizers.local.LocalMomentum`, or None (default): as compiled. The asynchronous
        default shortens it by the lag of its windowed commits."""
        return None

    def describe(self, num_workers: int) -> str:
        """One line for the fit-start log: the rule as it will run with ``num_workers`` workers.

        Rules that apply something on top of the user's optimizer by default (an
        outer momentum step, say) say so here, with the argument that turns it off.
        """
        return repr(self)

    # ------------------------------------------------------------ config
    def get_config(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this optimizer (see :meth:`from_config`)."""
        return {"window": self.window, "staleness_bound": self.staleness_bound}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> DistributedOptimizer:
        return cls(**dict(config))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.get_config().items()))))


def check_overlap(overlap: Any, optimizer: DistributedOptimizer, mode: str) -> bool:
    """Validate ``overlap`` (commits in flight while the worker trains on) for ``optimizer`` in ``mode``.

    In synchronous mode the worker trains its next window while the round of its
    last commit closes, and merges the round's reply when it arrives.

    Raises:
        ConfigError: ``overlap`` is not a bool, or it is True for a rule with
            ``overlaps = False`` or with a ``staleness_bound`` (an SSP admission must
            stop the worker).
    """
    if not isinstance(overlap, bool):
        raise ConfigError(f"`overlap` must be True or False; received overlap={overlap!r}")
    if overlap and not optimizer.overlaps:
        raise ConfigError(f"{type(optimizer).__name__} cannot train on while a commit is in flight; received overlap=True")
    if overlap and optimizer.staleness_bound is not None:
        raise ConfigError("`overlap=True` cannot honour a staleness_bound (an SSP admission must stop the worker); "
                          f"received staleness_bound={optimizer.staleness_bound!r}")
    return overlap


def worker_batch_size(batch_size: int, num_workers: int, split: bool) -> int:
    """Each worker's batch: ``ceil(batch_size / num_workers)`` when ``split``, else ``batch_size``.

    Splitting treats ``batch_size`` as the global batch, as Keras' distribution
    strategies do: with an averaging rule each worker then takes as many local
    steps per epoch as ``model.fit`` takes in all, which is what keeps the
    center's progress per epoch equal to plain training's.
    """
    return -(-int(batch_size) // int(num_workers)) if split else int(batch_size)
