"""A quiet console: TensorFlow's native start-up records held to ``TF_CPP_MIN_LOG_LEVEL``.

Spark starts Python workers that import TensorFlow, and TensorFlow's C++
start-up lines would fill a user's console from every one of them. elephant
gives the workers it starts ``TF_CPP_MIN_LOG_LEVEL=3`` unless the user set a
level, and filters what TensorFlow writes before its own filter is in place.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping

__all__ = ["TF_LOG_ENV", "TF_LOG_QUIET", "native_log_filter", "quiet_tensorflow_import", "tf_log_level"]

#: TensorFlow's C++ log threshold (0: all, 1: no INFO, 2: no WARNING either, 3: no ERROR either)
#: and the value elephant gives the Python workers it starts when the user set none.
TF_LOG_ENV = "TF_CPP_MIN_LOG_LEVEL"
TF_LOG_QUIET = "3"

#: A line that starts a glog/absl record: severity letter and month-day ("I0000 00:00:17... port.cc:153] ...").
_NATIVE_RECORD = re.compile(r"^([IWEF])\d{4} ")
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}


def tf_log_level(env: Mapping[str, str]) -> int:
    """TensorFlow's C++ log threshold set in ``env`` (0 when unset or unreadable)."""
    try:
        return max(0, int(env.get(TF_LOG_ENV, "0")))
    except ValueError:
        return 0


def native_log_filter(level: int) -> Callable[[str], bool]:
    """Which lines of native stderr to keep at TensorFlow's log threshold ``level``.

    TensorFlow 2.21 logs through absl before absl is initialised, so its
    start-up records (oneDNN, CUDA) reach stderr whatever
    ``TF_CPP_MIN_LOG_LEVEL`` says. The returned predicate drops the one-line
    records below ``level`` and absl's notice about them; every other line
    (a Python traceback, a fatal record) is kept. TensorFlow's own filter
    already drops its multi-line INFO record (CPU features) at level 1 and up.
    """

    def keep(line: str) -> bool:
        if line.rstrip("\r\n") == _ABSL_NOTICE:
            return level < 1
        record = _NATIVE_RECORD.match(line)
        return record is None or record.group(1) == "F" or _SEVERITY[record.group(1)] >= level

    return keep


@contextlib.contextmanager
def quiet_tensorflow_import(env: Mapping[str, str] | None = None) -> Iterator[None]:
    """Run the block (an ``import tensorflow``) with native stderr filtered by :func:`native_log_filter`.

    File descriptor 2 is captured in a temporary file and the lines kept are
    written back when the block ends, so nothing is lost but the records below
    ``TF_CPP_MIN_LOG_LEVEL`` (of ``env``, default ``os.environ``). With the level
    at 0 the block runs as it is.
    """
    level = tf_log_level(os.environ if env is None else env)
    if level == 0:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            keep = native_log_filter(level)
            kept = "".join(line for line in capture.read().decode("utf-8", "replace").splitlines(keepends=True)
                           if keep(line))
            if kept:
                os.write(2, kept.encode("utf-8"))
