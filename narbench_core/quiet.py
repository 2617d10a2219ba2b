"""Quiet by default: the ``narbench`` command's stderr carries narbench's own progress bars and one-line
errors, not the libraries' start-up logs; ``narbench -v`` leaves the libraries alone.

Three kinds of library output reach stderr:

- Native log lines written straight to file descriptor 2. TensorFlow (behind seqio) prints, while it
  is imported and before its absl logging is initialised, ``WARNING: All log messages before
  absl::InitializeLog() ...``, ``I0000 ... port.cc:153] oneDNN custom operations are on ...`` and
  ``I0000 ... cudart_stub.cc:31] Could not find cuda drivers ...``; no environment variable reaches
  these (``TF_CPP_MIN_LOG_LEVEL`` and ``GLOG_minloglevel`` act only after initialisation, and absl-py's
  Python logging is a different library). tensorflow_text's copy of SentencePiece prints
  ``normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty ...`` each time a tokenizer op is built,
  also with no switch. So ``quiet_process`` routes file descriptor 2 through a small filter process
  that drops these lines (``is_library_log``) and passes every other byte on; Python's own
  ``sys.stderr`` (narbench's messages, progress bars, tracebacks) writes to the terminal directly. The
  filter is a forked process, not a thread, so a fatal native message written just before the
  process aborts still comes out; fatal (``F``, ``LOG(FATAL)``) lines are never dropped.
- Native log lines after initialisation (TensorFlow's, XLA's): ``TF_CPP_MIN_LOG_LEVEL=3``, set before
  anything imports TensorFlow or JAX and inherited by the timing workers narbench spawns. It hides
  messages only; ``TF_ENABLE_ONEDNN_OPTS``, which changes TensorFlow's arithmetic, is left alone.
- Python ``logging`` records (JAX's platform warnings, orbax's and absl's INFO, TensorFlow's Python
  logger) below ERROR, and Python ``warnings``: narbench itself uses neither, so both are the
  libraries'. A user's ``-W``/``PYTHONWARNINGS`` still wins.
"""
from __future__ import annotations

import io
import logging
import os
import re
import signal
import sys
import warnings

# Library log lines below fatal severity, one line without its line ending.
_LIBRARY_LOG = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IWE]\d{4} [\d:.]+ +\d+ [^\s\]]+:\d+\] .*"          # absl/glog: TensorFlow, XLA, CUDA stubs
    r"|[\w./-]+\.cc\(\d+\) LOG\((?:INFO|WARNING|ERROR)\) .*")  # SentencePiece's own logging


def is_library_log(line: str) -> bool:
    """Whether ``line`` (without its line ending) is a native library's non-fatal log line."""
    return _LIBRARY_LOG.fullmatch(line) is not None


def quiet_process() -> None:
    """Make this process quiet (see the module docstring). Call it once, in the program's own process
    (the ``narbench`` command), before anything imports TensorFlow or JAX."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if not sys.warnoptions:
        warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    _filter_native_stderr()


def _filter_native_stderr() -> None:
    """Route file descriptor 2 through a forked filter process; rebind ``sys.stderr`` to the real one."""
    if not hasattr(os, "fork"):
        return
    try:
        sys.stderr.flush()
        real = os.dup(2)
        read, write = os.pipe()
    except (OSError, ValueError, AttributeError):       # no usable stderr: nothing to keep quiet
        return
    try:
        pid = os.fork()
    except OSError:                                     # no process to spare: stay as we are
        for fd in (real, read, write):
            os.close(fd)
        return
    if pid == 0:                                        # the filter: reads the pipe until every writer is gone
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the command's; the filter drains
            os.dup2(read, 0)
            os.close(1)                                 # so a reader of the command's stdout sees its end
            os.closerange(3, 1 << 16)
            pass_through(0, 2)
        finally:
            os._exit(0)
    os.close(read)
    os.dup2(write, 2)
    os.close(write)
    sys.stderr = io.TextIOWrapper(io.FileIO(real, "w"), encoding=sys.stderr.encoding or "utf-8",
                                  errors="backslashreplace", line_buffering=True, write_through=True)


def pass_through(source: int, sink: int) -> None:
    """Copy ``source`` to ``sink`` until end of file, leaving out library log lines. A line ends at
    ``\\n``, ``\\r\\n`` or a lone ``\\r`` (a progress bar's redraw) and is passed on as soon as it ends."""
    pending = b""
    while True:
        chunk = os.read(source, 1 << 16)
        if chunk:
            pending += chunk
            pieces = re.split(rb"(?<=\n)|(?<=\r)(?=[^\n])", pending)
            pending = pieces.pop()                      # b"" or an unfinished line
        else:
            pieces, pending = [pending], b""
        kept = b"".join(p for p in pieces
                        if not is_library_log(p.rstrip(b"\r\n").decode("utf-8", "replace")))
        while kept:
            kept = kept[os.write(sink, kept):]
        if not chunk:
            return
