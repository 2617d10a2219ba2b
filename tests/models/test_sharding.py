"""Data parallelism: one train step sharded over 2 (forced host) devices equals the 1-device step."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from narbench_core.paths import enable_compilation_cache
    enable_compilation_cache()
    from models import sharding
    from models.config import preset
    from models.train import TrainConfig, init_state, make_train_step

    assert jax.device_count() == 2, jax.devices()
    def compare(kind):
        # Dropout on: its keys must agree too. One layer each side: the sharding is the same, the compile shorter.
        config = preset("tiny", kind=kind, vocab_size=40, num_encoder_layers=1, num_decoder_layers=1)
        cfg = TrainConfig(steps=10, warmup_steps=2, learning_rate=1e-2, max_length=16)
        rng = np.random.default_rng(0)
        lengths = rng.integers(3, 16, size=8)
        batch = {name: np.where(np.arange(16)[None] < lengths[:, None],
                                rng.integers(4, 40, size=(8, 16)), 0).astype(np.int32)
                 for name in ("inputs", "targets")}
        results = {}
        for n in (1, 2):
            mesh = sharding.make_mesh(jax.devices()[:n])
            step, tx = make_train_step(config, cfg)
            state = init_state(config, cfg, tx, mesh)
            key = sharding.replicate(jax.random.PRNGKey(0), mesh)
            sharded = sharding.shard_batch(batch, mesh)
            assert len(sharded["inputs"].sharding.device_set) == n
            state, metrics = step(state, sharded, key)
            state, metrics = step(state, sharded, key)              # two steps: optimizer state too
            results[n] = (jax.device_get(state.params), {k: float(v) for k, v in metrics.items()})
        (p1, m1), (p2, m2) = results[1], results[2]
        diffs = jax.tree_util.tree_leaves(jax.tree_util.tree_map(
            lambda a, b: float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) + 1e-12)), p1, p2))
        return {"metrics1": m1, "metrics2": m2, "max_rel_param_diff": max(diffs)}

    print(json.dumps({kind: compare(kind) for kind in sys.argv[1:]}))
""")


@pytest.mark.slow
def test_sharded_step_equals_single_device_step():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, "ar", "padir"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for kind, out in results.items():                       # one process: JAX starts up once
        m1, m2 = out["metrics1"], out["metrics2"]
        assert m1.keys() == m2.keys()
        for name in m1:
            assert m2[name] == pytest.approx(m1[name], rel=1e-4, abs=1e-5), (kind, name)
        assert out["max_rel_param_diff"] < 1e-4, kind
