"""How a model's tensors are spread over the shards of a parameter server, and how many shards.

Two pure decisions over numbers (no I/O, no threads):

* :func:`plan_shards` assigns the tensors of a model to ``S`` shards: largest
  first onto the least-loaded shard (by bytes); a tensor larger than
  ``total / S`` is first cut along its first axis into contiguous row ranges,
  which the same greedy pass spreads over the shards. The resulting
  :class:`ShardPlan` splits a weight list into one list per shard and joins
  such lists back, byte for byte.
* :func:`choose_shards` picks ``S`` from the model's size, the number of
  workers and how often each commits, with the costs measured for one
  parameter-server process (``benchmarks/ps_roundtrip.py`` and ``ps_scale.py``).

The shards themselves are ordinary :class:`~elephant.ps.store.Store` objects
(each over its slice, built by :func:`elephant.ps.shard_client.shard_stores`),
reached through :class:`elephant.ps.shard_client.ShardedClient`.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from elephant.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

__all__ = ["Piece", "ShardPlan", "check_per_shard", "plan_shards", "choose_shards", "COMMIT_FIXED_S", "COMMIT_PER_MB_S",
           "PROCESS_BYTES_PER_S", "PROCESS_COMMITS_PER_S"]

#: Server CPU seconds per commit (commit in, reply out), fixed part. This and the next three are one
#: parameter-server process's costs and capacity, from its benchmarks (docs/parameter_server.md, "The pieces").
COMMIT_FIXED_S = 0.55e-3
#: Server CPU seconds per commit per MB (10**6 bytes) of model.
COMMIT_PER_MB_S = 0.7e-3
#: Bytes per second one parameter-server process moves in each direction.
PROCESS_BYTES_PER_S = 1e9
#: Commits per second one process serves before the GIL binds, whatever their size.
PROCESS_COMMITS_PER_S = 600.0
#: The section of docs/parameter_server.md a request-bound rate's warning points to.
REQUEST_BOUND_SECTION = "The pieces"


class Piece(NamedTuple):
    """One part of one tensor held by a shard.

    Attributes:
        tensor: the tensor's index in the weight list.
        rows: ``(start, stop)`` along the first axis for a tensor cut into
            row ranges, or None for a whole tensor.
    """

    tensor: int
    rows: tuple[int, int] | None = None


def _spec(index: int, item: Any) -> tuple[tuple[int, ...], np.dtype]:
    """``(shape, dtype)`` of an array-like with ``shape`` and ``dtype``, or of a ``(shape, dtype)`` pair."""
    try:
        if hasattr(item, "shape") and hasattr(item, "dtype"):
            shape, dtype = item.shape, item.dtype
        else:
            shape, dtype = item
        shape = tuple(int(n) for n in shape)
        dtype = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"`tensors[{index}]` must be an array or a (shape, dtype) pair; received {item!r}") from exc
    if any(n < 0 for n in shape):
        raise ConfigError(f"`tensors[{index}]` has a negative dimension; received shape={shape}")
    return shape, dtype


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """Which pieces of which tensors each shard holds; made by :func:`plan_shards`.

    Attributes:
        shapes: every tensor's shape, in weight-list order.
        dtypes: every tensor's dtype.
        shards: per shard, its pieces in ``(tensor, first row)`` order.
        codec: the :class:`~elephant.optimizers.codecs.Codec` of a rule that compresses its
            commits (:class:`~elephant.optimizers.Compressed`), whose encoded layouts
            :meth:`split_commit` cuts; None (default) for plain commits.
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    shards: tuple[tuple[Piece, ...], ...]
    codec: Any = None  # the Codec of compressed commits (their encoded layout is split), or None

    @property
    def num_shards(self) -> int:
        """Number of shards ``S``."""
        return len(self.shards)

    def piece_bytes(self, piece: Piece) -> int:
        """Bytes of one piece."""
        return math.prod(self.piece_shape(piece)) * self.dtypes[piece.tensor].itemsize

    def shard_bytes(self) -> list[int]:
        """Bytes held by each shard."""
        return [sum(self.piece_bytes(p) for p in pieces) for pieces in self.shards]

    def _check(self, weights: Sequence[Any], what: str) -> None:
        if len(weights) != len(self.shapes):
            raise DataError(f"{what}: expected {len(self.shapes)} tensors, received {len(weights)}")
        for i, (w, shape, dtype) in enumerate(zip(weights, self.shapes, self.dtypes)):
            if tuple(np.shape(w)) != shape or np.asarray(w).dtype != dtype:
                raise DataError(f"{what}: tensor {i}: expected {dtype}{list(shape)}, "
                                f"received {np.asarray(w).dtype}{list(np.shape(w))}")

    def split(self, weights: Sequence[np.ndarray]) -> list[list[np.ndarray]]:
        """One list of arrays per shard, in the order of :attr:`shards`.

        Row ranges are views of ``weights`` (no copy) where the input is an array.

        Raises:
            DataError: ``weights`` do not match the plan's shapes and dtypes.
        """
        self._check(weights, "split")
        arrays = [np.asarray(w) for w in weights]
        return [[arrays[p.tensor] if p.rows is None else arrays[p.tensor][p.rows[0]:p.rows[1]] for p in pieces]
                for pieces in self.shards]

    def split_commit(self, tensors: Sequence[np.ndarray]) -> list[list[np.ndarray]]:
        """A commit's tensors cut as :meth:`split` cuts weights: plain ones by :meth:`split`; with a
        :attr:`codec`, the encoded layout (every tensor's codes, then every tensor's side array).

        Each shard gets its pieces' codes (row ranges of a cut tensor's codes), then their side
        arrays: a whole tensor's as it is; for a piece of a cut tensor, the int8 scales of its
        blocks (the plan cut it at block boundaries, see :func:`plan_shards`), or the one
        scale of a tensor with ``block=None``, or the empty side of bf16 and of tensors sent
        raw. So each shard decodes its slice to the same numbers the whole commit decodes to.

        Raises:
            DataError: ``tensors`` do not match the plan (or its layout).
        """
        if self.codec is None:
            return self.split(tensors)
        count = len(self.shapes)
        if len(tensors) != 2 * count:
            raise DataError(f"split: a compressed commit of {count} tensors has {2 * count} arrays (codes, then "
                            f"scales); received {len(tensors)}")
        codes, sides = [np.asarray(t) for t in tensors[:count]], [np.asarray(t) for t in tensors[count:]]
        for i, (c, shape) in enumerate(zip(codes, self.shapes)):
            if c.shape != shape:
                raise DataError(f"split: tensor {i}'s codes: expected shape {list(shape)}, received {list(c.shape)}")
        block = self.codec.block
        out = []
        for pieces in self.shards:
            data, side = [], []
            for p in pieces:
                if p.rows is None:
                    data.append(codes[p.tensor])
                    side.append(sides[p.tensor])
                    continue
                data.append(codes[p.tensor][p.rows[0]:p.rows[1]])
                if block is None or sides[p.tensor].size == 0:  # one scale, or none: every piece carries it
                    side.append(sides[p.tensor])
                    continue
                row = math.prod(self.shapes[p.tensor][1:])
                start, stop = p.rows[0] * row, p.rows[1] * row
                if start % block:
                    raise DataError(f"split: tensor {p.tensor} is cut at row {p.rows[0]}, inside a block of "
                                    f"{block}: the plan was not made for this codec")
                side.append(sides[p.tensor][start // block: -(-stop // block)])
            out.append(data + side)
        return out

    def join(self, parts: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
        """The weight list that :meth:`split` cut into ``parts``: the exact inverse, byte for byte.

        A whole tensor is returned as its shard gave it (not copied); a tensor
        cut into row ranges is concatenated into a new array.

        Raises:
            DataError: ``parts`` do not match the plan (count of shards or
                pieces, shapes, dtypes).
        """
        if len(parts) != self.num_shards:
            raise DataError(f"join: expected {self.num_shards} shards' tensors, received {len(parts)}")
        found: dict[int, list[tuple[int, np.ndarray]]] = {}
        for s, (pieces, arrays) in enumerate(zip(self.shards, parts)):
            if len(arrays) != len(pieces):
                raise DataError(f"join: shard {s}: expected {len(pieces)} tensors, received {len(arrays)}")
            for k, (piece, array) in enumerate(zip(pieces, arrays)):
                shape, dtype = self.piece_shape(piece), self.dtypes[piece.tensor]
                if tuple(np.shape(array)) != shape or np.asarray(array).dtype != dtype:
                    raise DataError(f"join: shard {s}, tensor {k} (a piece of tensor {piece.tensor}): expected "
                                    f"{dtype}{list(shape)}, received {np.asarray(array).dtype}{list(np.shape(array))}")
                found.setdefault(piece.tensor, []).append((0 if piece.rows is None else piece.rows[0], array))
        out = []
        for i in range(len(self.shapes)):
            chunks = [np.asarray(a) for _, a in sorted(found[i], key=lambda item: item[0])]
            out.append(chunks[0] if len(chunks) == 1 else np.concatenate(chunks, axis=0))
        return out

    def as_data(self) -> dict[str, list]:
        """The plan as plain lists, ints and dtype names (small, picklable, JSON-able); :meth:`from_data` inverts it."""
        data = {"shapes": [list(shape) for shape in self.shapes], "dtypes": [d.str for d in self.dtypes],
                "shards": [[[p.tensor] if p.rows is None else [p.tensor, *p.rows] for p in pieces]
                           for pieces in self.shards]}
        if self.codec is not None:
            data["codec"] = [self.codec.name, self.codec.block]
        return data

    @classmethod
    def from_data(cls, data: Any) -> ShardPlan:
        """The plan that :meth:`as_data` gave ``data``.

        Raises:
            ConfigError: ``data`` is not such a plan.
        """
        try:
            shapes = tuple(tuple(int(n) for n in shape) for shape in data["shapes"])
            dtypes = tuple(np.dtype(d) for d in data["dtypes"])
            shards = tuple(tuple(Piece(int(p[0]), None if len(p) == 1 else (int(p[1]), int(p[2]))) for p in pieces)
                           for pieces in data["shards"])
            codec = _codec(*data["codec"]) if data.get("codec") is not None else None
        except (KeyError, TypeError, ValueError, IndexError, ConfigError) as exc:
            raise ConfigError(f"`data` must be a shard plan's as_data(); received {data!r:.200}") from exc
        if len(shapes) != len(dtypes) or not shards:
            raise ConfigError(f"`data` must be a shard plan's as_data(); received {len(shapes)} shapes, "
                              f"{len(dtypes)} dtypes and {len(shards)} shards")
        return cls(shapes=shapes, dtypes=dtypes, shards=shards, codec=codec)

    def piece_shape(self, piece: Piece) -> tuple[int, ...]:
        """The shape of one piece."""
        shape = self.shapes[piece.tensor]
        return shape if piece.rows is None else (piece.rows[1] - piece.rows[0], *shape[1:])


def check_per_shard(plan: Any, items: Sequence[Any], name: str, noun: str) -> list[Any]:
    """``items`` as a list after checking that ``plan`` is a :class:`ShardPlan` and there is one ``noun`` per shard.

    Raises:
        ConfigError: naming ``plan`` or ``name`` and what was received.
    """
    if not isinstance(plan, ShardPlan):
        raise ConfigError(f"`plan` must be a ShardPlan (from plan_shards); received plan={plan!r}")
    items = list(items)
    if len(items) != plan.num_shards:
        raise ConfigError(f"`{name}` must hold one {noun} per shard of the plan ({plan.num_shards}); "
                          f"received {len(items)} {noun}s")
    return items


def _check_shards(shards: Any) -> int:
    if isinstance(shards, bool) or not isinstance(shards, (int, np.integer)) or shards < 1:
        raise ConfigError(f"`shards` must be a positive int; received shards={shards!r}")
    return int(shards)


def _codec(name: str, block: int | None) -> Any:
    from elephant.optimizers.codecs import Codec

    return Codec(name, block)


def _row_step(shape: tuple[int, ...], dtype: np.dtype, codec: Any) -> int:
    """Rows a cut must be a multiple of: 1, or for int8 blocks the rows that end a block (``row · r % block == 0``)."""
    block = getattr(codec, "block", None)
    if block is None or dtype.kind != "f":  # no scales per block, or a tensor sent raw
        return 1
    row = math.prod(shape[1:])
    return block // math.gcd(block, row) if row else 1


def plan_shards(tensors: Sequence[Any], shards: int, codec: Any = None) -> ShardPlan:
    """Assign a model's tensors to ``shards`` shards, largest first onto the least-loaded one.

    A tensor of more than ``total / shards`` bytes (with at least two rows) is
    first cut along axis 0 into ``min(rows, ceil(bytes / (total / shards)))``
    contiguous row ranges of near-equal length (the first ones one row longer).
    Then every piece, from the largest down (ties by tensor index, then first
    row), goes to the shard holding the fewest bytes so far (ties: fewest
    pieces, then lowest index). The plan depends only on the shapes, dtypes and
    ``shards``.

    Args:
        tensors: the model's weights in ``get_weights()`` order: arrays (or
            anything with ``shape`` and ``dtype``), or ``(shape, dtype)`` pairs.
        shards: the number of shards ``S`` >= 1.
        codec: the :class:`~elephant.optimizers.codecs.Codec` of a rule that compresses
            its commits, or None (default). With int8 blocks, a float tensor is cut only
            where a block ends (so each piece's scales are whole blocks of the tensor's),
            into at most as many ranges as such cuts allow; the plan keeps the codec
            (:attr:`ShardPlan.codec`) to split the encoded commits.

    Returns:
        The :class:`ShardPlan`.

    Raises:
        ConfigError: ``shards`` is not a positive int, ``tensors`` is empty or
            holds something without a shape and dtype, or the tensors cannot be
            cut into at least ``shards`` pieces (a shard would hold nothing).
    """
    shards = _check_shards(shards)
    specs = [_spec(i, t) for i, t in enumerate(tensors)]
    if not specs:
        raise ConfigError("`tensors` must hold at least one tensor; received an empty list")
    sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in specs]
    total = sum(sizes)
    pieces: list[tuple[int, Piece]] = []  # (bytes, piece)
    for i, ((shape, dtype), size) in enumerate(zip(specs, sizes)):
        rows = shape[0] if shape else 0
        count = min(rows, math.ceil(size * shards / total)) if size * shards > total and rows > 1 else 1
        if count == 1:
            pieces.append((size, Piece(i)))
            continue
        row_bytes = size // rows
        step = _row_step(shape, dtype, codec)
        if step == 1:
            bounds = [k * rows // count for k in range(count + 1)]
            bounds = [rows - b for b in reversed(bounds)]  # longer ranges first
        else:  # cuts at multiples of `step` rows, counted from row 0
            units = -(-rows // step)
            count = min(count, units)
            if count == 1:
                pieces.append((size, Piece(i)))
                continue
            bounds = [min(rows, (k * units // count) * step) for k in range(count + 1)]
        pieces.extend(((stop - start) * row_bytes, Piece(i, (start, stop))) for start, stop in zip(bounds, bounds[1:]))
    if len(pieces) < shards:
        raise ConfigError(f"{len(specs)} tensors of {total} bytes in all make only {len(pieces)} pieces, so some of "
                          f"the shards would hold nothing; use fewer shards; received shards={shards}")
    heap = [(0, 0, s) for s in range(shards)]  # (bytes, pieces, shard): the least-loaded shard on top
    held: list[list[Piece]] = [[] for _ in range(shards)]
    for size, piece in sorted(pieces, key=lambda item: (-item[0], item[1].tensor, item[1].rows or (0, 0))):
        load, count, s = heapq.heappop(heap)
        held[s].append(piece)
        heapq.heappush(heap, (load + size, count + 1, s))
    plan = ShardPlan(shapes=tuple(shape for shape, _ in specs), dtypes=tuple(dtype for _, dtype in specs),
                     shards=tuple(tuple(sorted(h, key=lambda p: (p.tensor, p.rows or (0, 0)))) for h in held),
                     codec=codec)
    logger.debug("planned %d tensors (%d bytes, %d pieces) over %d shards: %s bytes per shard", len(specs), total,
                 len(pieces), shards, plan.shard_bytes())
    return plan


def _check_positive(name: str, value: Any, *, integer: bool = False, low: float = 0.0, low_open: bool = True) -> float:
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low)
    if not ok:
        expected = ("an int" if integer else "a finite number") + (f" > {low:g}" if low_open else f" >= {low:g}")
        raise ConfigError(f"`{name}` must be {expected}; received {name}={value!r}")
    return value


def choose_shards(model_bytes: int, num_workers: int, commit_interval: float = 2.0, *,
                  utilization: float = 0.5, max_shards: int = 16, warn_requests: bool = True) -> int:
    """How many parameter-server shards a fit needs: the least ``S`` that keeps each one under ``utilization``.

    Every commit reaches every shard, each with ``1/S`` of the model. With
    ``R = num_workers / commit_interval`` commits per second and ``P`` bytes
    of model, one shard needs

    * CPU: ``R · (0.55 ms + 0.7 ms/MB · P/S)`` core-seconds per second
      (:data:`COMMIT_FIXED_S`, :data:`COMMIT_PER_MB_S`), and
    * bytes: ``R · P/S`` per second in each direction, of the ≈1 GB/s one
      process moves (:data:`PROCESS_BYTES_PER_S`),

    and ``S`` is the least integer that keeps both at or under ``utilization``
    (of one core, of 1 GB/s). Sharding cannot lower a shard's request rate
    ``R``: where ``R`` or its fixed CPU part alone is over ``utilization`` of
    what one process serves (:data:`PROCESS_COMMITS_PER_S`, about 600
    commits/s), the answer covers the per-byte parts only and a warning says
    that longer windows are the lever. Small models with few workers get 1.

    Args:
        model_bytes: ``P``, the bytes of one commit (the model's weights), >= 0.
        num_workers: ``K`` >= 1.
        commit_interval: seconds between two commits of one worker (the
            window's steps times a step's time), > 0. Default 2.
        utilization: the share of one core and of 1 GB/s a shard may use,
            in (0, 1]. Default 0.5 (headroom for bursts).
        max_shards: the largest answer, >= 1; a larger need is capped with a
            warning. Default 16.
        warn_requests: whether a request-bound rate is warned about (default
            True); False logs it at INFO (a caller that says so itself, as a
            fit's shard decision does, where the window is the user's choice).

    Returns:
        ``S`` in ``[1, max_shards]``.

    Raises:
        ConfigError: an argument is out of range (the message names it).
    """
    _check_positive("model_bytes", model_bytes, integer=True, low_open=False)
    _check_positive("num_workers", num_workers, integer=True, low=1, low_open=False)
    _check_positive("commit_interval", commit_interval)
    _check_positive("utilization", utilization)
    if utilization > 1:
        raise ConfigError(f"`utilization` must be a finite number in (0, 1]; received utilization={utilization!r}")
    _check_positive("max_shards", max_shards, integer=True, low=1, low_open=False)
    rate = num_workers / commit_interval
    megabytes = model_bytes / 1e6
    by_bytes = math.ceil(rate * model_bytes / (utilization * PROCESS_BYTES_PER_S))
    fixed = rate * COMMIT_FIXED_S
    request_bound = fixed >= utilization or rate >= utilization * PROCESS_COMMITS_PER_S
    cpu_left = utilization if request_bound else utilization - fixed
    by_cpu = math.ceil(rate * COMMIT_PER_MB_S * megabytes / cpu_left)
    need = max(1, by_bytes, by_cpu)
    shards = min(need, int(max_shards))
    logger.info("choose_shards: %d workers committing every %.3g s (%.1f commits/s) of %.1f MB at utilization %g: "
                "%d shard(s) for the bytes, %d for the CPU; chose %d", num_workers, commit_interval, rate, megabytes,
                utilization, by_bytes, by_cpu, shards)
    if request_bound:
        logger.log(logging.WARNING if warn_requests else logging.INFO,
                   "%.1f commits/s is over %g of what one parameter-server process serves; every shard receives "
                   "every commit, so shards do not help there: commit less often (a longer window) "
                   '(see docs/parameter_server.md, "%s").', rate, utilization, REQUEST_BOUND_SECTION)
    if need > shards:
        logger.warning("choose_shards: %d shards are needed for %.1f MB at %.1f commits/s; capped at max_shards=%d",
                       need, megabytes, rate, max_shards)
    return shards
