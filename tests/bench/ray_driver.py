"""A narbench driver over the Ray fakes, run as its own process by the Ray executor's tests (so a test can
kill it with SIGKILL): ``python ray_driver.py ADDRESS OUT SPEC``. It opens (or resumes) the spec's run
folder under OUT, trains through the Ray cluster at ADDRESS and times on this machine, then prints the
run folder."""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]


def main(address: str, out: str, spec_path: str) -> None:
    import ray

    import ray_fakes
    from bench import store
    from bench.executors.raycluster import RayExecutor
    from bench.families import load_suite
    from bench.runner import Runner

    ray.cloudpickle.register_pickle_by_value(ray_fakes)
    spec = load_suite(spec_path)
    run, _ = store.open_run(Path(out), spec.name, spec.spec_hash(), spec.to_toml(), "narbench run (test driver)")
    try:
        executor = RayExecutor(address=address, run_id=run.run_id, logs_to=run.path / store.LOGS, poll_s=0.2)
        Runner(spec, ray_fakes.deps(), run, progress=False, executor=executor).run()
    finally:
        run.release()
    print(run.path, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
