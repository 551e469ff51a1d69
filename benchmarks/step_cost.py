"""What the batch split costs in compute before anything is sent: one local step of a worker
against one step of plain Keras on the same cores.

With the batch split, each of ``K`` workers trains batches of ``B/K`` on ``1/K`` of the
cores and takes as many steps per epoch as plain Keras does with ``B`` on all of them.
If a step's cost were proportional to its samples and its cores, the two would take the
same time; this script measures how far they are from that. It times the optimizer's
update too: every replica updates every weight at every step, whatever its batch, so an
optimizer with state (Adam) and one without (SGD) are both measured, to tell that cost
from the forward and backward passes'.

For the 4.8 MB teacher MLP of ``workloads.py`` (128-1024-1024-10; ``--mb 19``: the 19 MB
one, 256-2048-2048-10), this script times ``model.fit`` over the same number of steps in
fresh processes:

* plain Keras: batch ``B`` on ``C`` threads;
* one worker of ``K = 2``: batch ``B/2`` on ``C/2`` threads, alone on the machine;
* with ``--pair``, also two such workers at once, as a fit's two tasks run (each in its own
  process; the slower one's step is kept): what they share beyond their own cores, the
  memory and its bandwidth, shows here and not in the worker alone;

each with the workload's ``Adam(1e-3)`` and with plain ``SGD(1e-3)`` (no state), and
prints the ratio of the worker's step to plain Keras' step. A ratio of 1.0 means the
split costs nothing; two workers then finish an epoch in plain Keras' time before
communication.

Run::

    python benchmarks/step_cost.py [--mb 5|19] [--pair] [--batch 64] [--threads 2] [--steps 300] [--repeats 3]

Writes ``benchmarks/results/step_cost.json`` (``step_cost_19mb.json`` with ``--mb 19``; ``_pair`` before
``.json`` with ``--pair``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


#: The teacher MLPs of ``workloads.py`` by their megabytes.
WORKLOADS = {5: "teacher-mlp-5mb", 19: "teacher-mlp-19mb"}


def _one(batch: int, threads: int, optimizer: str, steps: int, mb: int = 5) -> float:
    """Median seconds per step of ``model.fit`` (run in a child process: thread counts are per process)."""
    import numpy as np

    from elephant.replicas import limit_threads

    limit_threads(threads)  # as a worker of a task with ``threads`` cores caps them
    import keras
    import workloads

    model = workloads.make(WORKLOADS[mb]).build(0)  # the workload's MLP from seed 0's weights
    features = model.input_shape[-1]
    opt = keras.optimizers.Adam(1e-3) if optimizer == "adam" else keras.optimizers.SGD(1e-3)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (batch * steps, features)).astype("float32")
    y = rng.integers(0, 10, batch * steps)
    model.fit(x[: batch * 20], y[: batch * 20], batch_size=batch, epochs=1, verbose=0, shuffle=False)  # trace
    times = []
    for _ in range(3):
        t = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)
        times.append((time.perf_counter() - t) / steps)
    return statistics.median(times)


def _spawn(batch: int, threads: int, optimizer: str, steps: int, mb: int, copies: int = 1) -> float:
    """Seconds per step of ``copies`` children run at once (the slowest one's)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": str(threads)}
    argv = [sys.executable, __file__, "--child", str(batch), str(threads), optimizer, str(steps), str(mb)]
    children = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                for _ in range(copies)]
    outs = [child.communicate() for child in children]
    for child, (_, err) in zip(children, outs):
        if child.returncode:
            raise RuntimeError(f"a timing child failed ({child.returncode}):\n{err[-2000:]}")
    return max(float(out.strip().splitlines()[-1]) for out, _ in outs)


def main(args) -> None:
    half_batch, half_threads = -(-args.batch // 2), max(args.threads // 2, 1)
    rows = []
    for optimizer in ("adam", "sgd"):
        plain, worker, pair = [], [], []
        for _ in range(args.repeats):  # alternate, so that a change of load hits all
            plain.append(_spawn(args.batch, args.threads, optimizer, args.steps, args.mb))
            worker.append(_spawn(half_batch, half_threads, optimizer, args.steps, args.mb))
            if args.pair:
                pair.append(_spawn(half_batch, half_threads, optimizer, args.steps, args.mb, copies=2))
        p, w = statistics.median(plain), statistics.median(worker)
        row = {"optimizer": optimizer, "plain_ms": p * 1e3, "worker_ms": w * 1e3, "ratio": w / p,
               "plain_all": plain, "worker_all": worker}
        line = (f"{optimizer:5s} plain Keras batch {args.batch} on {args.threads} threads {p * 1e3:6.2f} ms/step; "
                f"a worker of 2, batch {half_batch} on {half_threads} {w * 1e3:6.2f} ms/step: {w / p:.2f}x")
        if pair:
            both = statistics.median(pair)
            row.update(pair_ms=both * 1e3, pair_ratio=both / p, pair_all=pair)
            line += f"; two at once {both * 1e3:6.2f} ms/step: {both / p:.2f}x"
        rows.append(row)
        print(line, flush=True)
    meta = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "time": time.strftime("%Y-%m-%d %H:%M"), "batch": args.batch, "threads": args.threads, "steps": args.steps,
            "model": f"{WORKLOADS[args.mb]} of benchmarks/workloads.py"}
    os.makedirs(RESULTS, exist_ok=True)
    name = "step_cost" + ("" if args.mb == 5 else f"_{args.mb}mb") + ("_pair" if args.pair else "") + ".json"
    with open(os.path.join(RESULTS, name), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(_one(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mb", type=int, choices=sorted(WORKLOADS), default=5, help="the teacher MLP: 4.8 or 19 MB")
    parser.add_argument("--pair", action="store_true", help="also time two workers at once")
    main(parser.parse_args())
