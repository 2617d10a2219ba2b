"""narbench_core.quiet: which native lines the ``narbench`` command hides, and that the filter keeps the rest."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from narbench_core import quiet

ROOT = Path(__file__).resolve().parents[2]

# Lines as TensorFlow 2.21, its CUDA stub, XLA and tensorflow_text's SentencePiece print them.
LIBRARY_LINES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795657265.040654   10202 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders. "
    "To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795657265.041797   10202 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU "
    "will not be used.",
    "E1126 01:02:03.456789   4242 cuda_dnn.cc:8310] Unable to register cuDNN factory: Attempting to register "
    "factory for plugin cuDNN when one has already been registered",
    "W1126 01:02:03.456789   4242 cpu_compiler.cc:123] something XLA would like you to know",
    "normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty. use identity normalization.",
]
OWN_LINES = [
    "narbench: error: /tmp/bad.toml: malformed TOML: Invalid initial character for a key part (at line 2, column 3)",
    "F1126 01:02:03.456789   4242 check.cc:12] Check failed: x > 0",          # fatal: why the process died
    "trainer_interface.cc(99) LOG(FATAL) the corpus is empty",
    "Traceback (most recent call last):",
    "I0000 is not a log line",
]


def test_library_log_lines_are_told_from_everything_else():
    assert [line for line in LIBRARY_LINES if not quiet.is_library_log(line)] == []
    assert [line for line in OWN_LINES if quiet.is_library_log(line)] == []


def test_the_filter_drops_library_lines_and_passes_the_rest_unchanged():
    text = ("\n".join(LIBRARY_LINES[:3] + OWN_LINES[:2] + LIBRARY_LINES[3:]) + "\n"
            + "bar  10%\rbar  20%\r" + LIBRARY_LINES[-1] + "\r\nno newline at the end")
    source_r, source_w = os.pipe()
    sink_r, sink_w = os.pipe()
    os.write(source_w, text.encode())
    os.close(source_w)
    quiet.pass_through(source_r, sink_w)
    os.close(sink_w)
    with os.fdopen(sink_r, "rb") as f:
        out = f.read().decode()
    os.close(source_r)
    assert out == "\n".join(OWN_LINES[:2]) + "\n" + "bar  10%\rbar  20%\r" + "no newline at the end"


QUIET_PROCESS = r"""
import os, sys
from narbench_core import quiet
quiet.quiet_process()
os.write(2, (sys.argv[1] + "\n" + sys.argv[2] + "\n").encode())   # native code writes to fd 2 directly
print("narbench: python's own stderr", file=sys.stderr)
import logging, warnings
logging.getLogger("jax._src.xla_bridge").warning("An NVIDIA GPU may be present on this machine, but a "
                                                 "CUDA-enabled jaxlib is not installed. Falling back to cpu.")
logging.getLogger("absl").info("orbax: saving a checkpoint")
warnings.warn("a library's warning")
os.write(2, (sys.argv[3] + "\n").encode())
os.abort()                                                        # as LOG(FATAL) ends a process
"""


def test_a_quiet_process_hides_library_lines_logs_and_warnings_and_keeps_a_fatal_line_written_before_abort():
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", QUIET_PROCESS, LIBRARY_LINES[0], LIBRARY_LINES[2], OWN_LINES[1]],
                          capture_output=True, text=True, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert done.returncode != 0
    assert sorted(done.stderr.splitlines()) == sorted(["narbench: python's own stderr", OWN_LINES[1]])
