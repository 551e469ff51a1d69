"""Compressed commits as a rule transform: ``Compressed(inner, codec, block)`` wraps any rule."""

from __future__ import annotations

from typing import Any

from elephant.errors import ConfigError
from elephant.optimizers.base import Commit, DistributedOptimizer
from elephant.optimizers.codecs import (DEFAULT_BLOCK, Codec, decode_layout, encode_with_feedback, layout_template,
                                        zero_residual)
from elephant.optimizers.registry import get, register, serialize
from elephant.protocol import MODES

__all__ = ["Compressed", "check_reply_mode"]


def check_reply_mode(optimizer: DistributedOptimizer, mode: str) -> None:
    """Refuse compressed replies outside synchronous mode, where every worker holds one view of the center.

    Raises:
        ConfigError: ``optimizer.reply_codec`` is set and ``mode`` is not ``"synchronous"``.
    """
    if optimizer.reply_codec is not None and mode != "synchronous":
        raise ConfigError(
            "Compressed(replies=True) compresses the replies of synchronous rounds, which every worker of the "
            f"round shares; received mode={mode!r} (use mode='synchronous' or replies=False)")


def _decoded(codec: Codec, commit: Commit) -> Commit:
    return Commit(tensors=decode_layout(codec, commit.tensors), num_steps=commit.num_steps,
                  num_samples=commit.num_samples, base_clock=commit.base_clock)


@register
class Compressed(DistributedOptimizer):
    """Any rule with its commits encoded by a lossy codec and error feedback on the worker.

    Worker: the inner rule makes its payload ``p`` (a delta, a normalised delta or,
    for EASGD, weights); the worker sends the encoded ``t = p + r`` and keeps the
    residual ``r ← t − decode(encode(t))`` in its state for the next window, so
    over a partition pass the decoded payloads add up to the inner rule's
    exactly, less the last residual (at most half a quantisation step per
    element, see :mod:`elephant.optimizers.codecs`). Replies are the inner
    rule's, unchanged, unless ``replies=True`` (below).

    Compressed replies (``replies=True``, synchronous mode only): the server keeps
    the *view* of the center that every worker of the fit holds, starting each
    epoch at the center. When a round closes it encodes the step from the view to
    the new center (:func:`~elephant.optimizers.codecs.encode_change`), moves the
    view by what the encoding keeps, and sends that encoded step to each worker of
    the round instead of the dense center (once encoded per round, whatever the
    number of workers); the worker adds it to the view it holds and checks the
    result's digest against the server's, so both hold the same bits. The server's
    center stays exact: only the point the workers start their next window from
    is rounded, by at most one encoding's error of the last step (the next step is
    measured from the view, so the error is fed back and does not pile up). Each
    worker's commit is measured from the view it holds, as any commit is measured
    from what the worker pulled. Pulls, replays and a task's first reply carry the
    dense view. The rule's own reply tensors travel uncompressed.

    Server: decodes the commit to float32 and calls the inner rule, so every
    rule keeps its meaning; with ``streams_rounds`` each commit is decoded as it
    is added to the round, keeping the server's memory at one model.

    What travels is the encoded layout (:func:`~elephant.optimizers.codecs.layout_template`:
    the ``int8`` or ``uint16`` codes in each tensor's shape, then the float32
    scales), so the wire's checksum covers the encoded bytes; ``int8`` with
    blocks of 256 sends 3.9 times fewer bytes than float32, ``bf16`` 2 times.

    The rule transform is a :class:`DistributedOptimizer` holding the inner one,
    not a hook in the runtime: it is one picklable object that ``get()``,
    ``SparkModel(optimizer=...)``, :func:`~elephant.optimizers.simulate` and
    ``simulate_fit`` take as they are, and the runtime only learns the payload's
    structure from :meth:`commit_template`. Modes, window, batch split, overlap
    and round streaming are the inner rule's.

    Not done: asynchronous replies stay dense (each worker holds its own center,
    so a change against it would need the server to keep one view per worker); the
    residual lives in the worker state of one partition pass and is dropped at its
    end (so with one commit per pass, the asynchronous default's short-pass setting,
    error feedback never carries over); with ``norm_guard`` the store measures the
    encoded arrays, a proxy.

    Shards: the rule is elementwise when its inner rule is; a sharded server's plan
    cuts tensors only at the codec's block ends and splits the encoded layout
    (:meth:`elephant.ps.shards.ShardPlan.split_commit`), so each shard decodes its
    slice exactly as the whole commit would be decoded.

    Args:
        inner: the rule to compress: a name, a config dict or an instance.
            Default ``"delayednesterov"`` (the asynchronous default rule).
        codec: ``"int8"`` (default) or ``"bf16"``.
        block: ``int8`` elements per scale along the flattened tensor; default
            256; None: one scale per tensor. ``bf16`` ignores it (kept as None).
        window: when given, replaces the inner rule's window. Default None (keep it).
        staleness_bound: when given, replaces the inner rule's SSP bound. Default None (keep it).
        replies: also send each synchronous round's reply encoded with ``codec``, as the
            change of the workers' view of the center (above). Default False. A fit or a
            store in another mode refuses it.

    Raises:
        ConfigError: an unknown inner rule, codec or an invalid block, or a
            ``replies`` that is not a bool.

    Reference: F. Seide et al., "1-bit stochastic gradient descent and its
    application to data-parallel distributed training of speech DNNs",
    Interspeech 2014 (error feedback); T. Dettmers, "8-bit approximations for
    parallelism in deep learning", ICLR 2016; S. P. Karimireddy et al., "Error
    feedback fixes SignSGD and other gradient compression schemes", ICML 2019.
    """

    name = "compressed"
    aliases = ("compress",)
    modes = MODES  # the registry's check; each instance has its inner rule's modes

    def __init__(self, inner: Any = "delayednesterov", codec: str = "int8", block: int | None = DEFAULT_BLOCK,
                 window: int | None = None, staleness_bound: int | None = None, replies: bool = False):
        if not isinstance(replies, bool):
            raise ConfigError(f"`replies` must be True or False; received replies={replies!r}")
        if isinstance(inner, Compressed):
            raise ConfigError(f"`inner` must be an uncompressed rule; received inner={inner!r}")
        if not isinstance(inner, (str, dict, DistributedOptimizer)):
            raise ConfigError(f"`inner` must be an optimizer name, config dict or instance; received inner={inner!r}")
        inner = get(inner)
        if isinstance(inner, Compressed):  # a name or dict that resolved to this class
            raise ConfigError(f"`inner` must be an uncompressed rule; received inner={inner!r}")
        overrides = {k: v for k, v in (("window", window), ("staleness_bound", staleness_bound)) if v is not None}
        if overrides:
            inner = type(inner).from_config({**inner.get_config(), **overrides})
        self.inner = inner
        self.codec = Codec(codec, block)
        self.replies = replies
        self.reply_codec = self.codec if replies else None
        # The runtime reads these per instance: they are the inner rule's.
        self.modes = inner.modes
        self.default_window = inner.default_window
        self.splits_batch = inner.splits_batch
        self.averaging_shortfall = inner.averaging_shortfall
        self.averaging_figures = inner.averaging_figures
        self.overlaps = inner.overlaps
        self.streams_rounds = inner.streams_rounds
        self.elementwise = inner.elementwise  # shards decode their slices (the plan cuts at block ends)
        self.window_from_costs = inner.window_from_costs
        self.window = inner.window
        self._window_given = inner._window_given
        self.staleness_bound = inner.staleness_bound

    @property
    def outer(self) -> Any:
        """The inner rule's outer momentum step, if it has one (read by the fit-start warnings)."""
        return getattr(self.inner, "outer", None)

    # ----------------------------------------------------------------- worker
    def commit_template(self, template):
        return layout_template(self.codec, self.inner.commit_template(template))

    def worker_init(self, center):
        return {"inner": self.inner.worker_init(center), "residual": None}

    def make_commit(self, state, weights, pulled, num_steps):
        payload, inner_state = self.inner.make_commit(state["inner"], weights, pulled, num_steps)
        residual = state["residual"] if state["residual"] is not None else zero_residual(payload)
        layout, residual = encode_with_feedback(self.codec, payload, residual)
        return layout, {"inner": inner_state, "residual": residual}

    def on_reply(self, state, weights, reply):
        weights, inner_state = self.inner.on_reply(state["inner"], weights, reply)
        return weights, {**state, "inner": inner_state}

    # ----------------------------------------------------------------- server
    def server_init(self, center, num_workers):
        return self.inner.server_init(center, num_workers)

    def on_pull(self, state, center, clock, worker):
        return self.inner.on_pull(state, center, clock, worker)

    def on_learning_rate_change(self, state, ratio):
        return self.inner.on_learning_rate_change(state, ratio)

    def apply(self, state, center, clock, worker, commit):
        return self.inner.apply(state, center, clock, worker, _decoded(self.codec, commit))

    def apply_round(self, state, center, clock, commits):
        return self.inner.apply_round(state, center, clock, {k: _decoded(self.codec, c) for k, c in commits.items()})

    def round_begin(self, num_workers):
        return self.inner.round_begin(num_workers)

    def round_add(self, acc, worker, commit):
        return self.inner.round_add(acc, worker, _decoded(self.codec, commit))

    def round_end(self, state, center, clock, acc, workers):
        return self.inner.round_end(state, center, clock, acc, workers)

    # ----------------------------------------------------------------- fit
    def local_optimizer_mismatch(self, local):
        return self.inner.local_optimizer_mismatch(local)

    def setup_warning(self, window, num_workers, batch_split):
        return self.inner.setup_warning(window, num_workers, batch_split)

    def for_fit(self, local, num_workers, batch_split, window):
        inner = self.inner.for_fit(local, num_workers, batch_split, window)
        return self if inner is self.inner else Compressed(inner, self.codec.name, self.codec.block,
                                                           replies=self.replies)

    def local_rate_scale(self, local, num_workers, batch_split):
        return self.inner.local_rate_scale(local, num_workers, batch_split)

    def local_rate_warmup(self, local, num_workers, batch_split):
        return self.inner.local_rate_warmup(local, num_workers, batch_split)

    def local_moment(self, local, num_workers, batch_split):
        return self.inner.local_moment(local, num_workers, batch_split)

    def local_momentum(self, local, num_workers, batch_split, window):
        return self.inner.local_momentum(local, num_workers, batch_split, window)

    def describe(self, num_workers):
        block = "" if self.codec.name == "bf16" else f", block={self.codec.block}"
        replies = ", and synchronous replies as encoded changes" if self.replies else ""
        return (f"{self.inner.describe(num_workers)}; commits compressed with {self.codec.name}{block} and error "
                f"feedback{replies}")

    def get_config(self):
        return {"inner": serialize(self.inner), "codec": self.codec.name, "block": self.codec.block,
                "replies": self.replies}

    def __hash__(self) -> int:
        return hash((type(self), self.inner, self.codec, self.replies))
