"""The simulation engine patches of app/runtime/engine_patches.py, checked against flwr 1.42's vce_api: the opt-in
poll patch (fast_poll: the loop that hands instructions to the engine's workers waits 5 ms instead
of 0.1 s) and the prompt stop of the warm engine (the engine's queues wait at most 20 ms between
looks at the stop event). Mechanics here; a real federation with and without the poll patch in
test_fast_poll_keeps_numbers_and_is_faster (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from queue import Empty

import pytest

from app.runtime import engine_patches as patches
from app.config import ConfigError
from tests.helpers import without_wall

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def vce_api():
    from flwr.server.superlink.fleet.vce import vce_api

    index = patches._ENGINE_LOOP["index"]  # on after a run_federation in this process
    patches.index_engine_messages(False)  # these tests are about the poll patch alone (test_engine_index.py)
    original, queue = vce_api.add_messages_to_queue, vce_api.Queue
    yield vce_api
    patches.fast_poll(0)
    vce_api.Queue = queue
    assert vce_api.add_messages_to_queue is getattr(vce_api, "_silofl_original_add_messages", original)
    if index:
        patches.index_engine_messages(True)


class _Event:
    """A stop event that records what the loop waits for and stops it after ``n`` waits."""

    def __init__(self, n: int) -> None:
        self.waits: list[float] = []
        self.n = n

    def is_set(self) -> bool:
        return len(self.waits) >= self.n

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return self.is_set()


class _State:
    def __init__(self, pending: dict[int, list[str]]) -> None:
        self.pending = pending

    def get_message_ins(self, node_id: int, limit: int) -> list[str]:
        out, self.pending[node_id] = self.pending[node_id][:limit], self.pending[node_id][limit:]
        return out


def test_fast_poll_replaces_the_loop_and_keeps_what_it_does(vce_api) -> None:
    from queue import Queue

    original = vce_api.add_messages_to_queue
    assert patches.fast_poll(0.005) is True
    patched = vce_api.add_messages_to_queue
    assert patched is not original and patched._silofl_poll_s == 0.005
    for loop, period in ((original, 0.1), (patched, 0.005)):  # same messages, same order; other period
        q: Queue = Queue()
        stop = _Event(3)
        loop(_State({7: ["a", "b"], 9: ["c"]}), q, {7: 0, 9: 1}, stop)
        assert [q.get_nowait() for _ in range(q.qsize())] == ["a", "c", "b"]
        assert stop.waits == [period] * 3
    assert patches.fast_poll(0) is False and vce_api.add_messages_to_queue is original


def test_fast_poll_is_skipped_with_a_warning_on_another_flower(vce_api, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    original = vce_api.add_messages_to_queue
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.43.0")
    with pytest.warns(RuntimeWarning, match="flwr 1.43.0"):
        assert patches.fast_poll(0.005) is False
    assert vce_api.add_messages_to_queue is original


def test_fast_poll_setting() -> None:
    assert patches.fast_poll_setting(True) == patches.FAST_POLL_S
    assert patches.fast_poll_setting(False) == 0.0
    assert patches.fast_poll_setting("0.01") == 0.01
    for off in ("", "0", "false", "off"):
        assert patches.fast_poll_setting(off) == 0.0
    for bad in ("fast", "0.5", "-1"):
        with pytest.raises(ConfigError, match="SILOFL_FAST_POLL"):
            patches.fast_poll_setting(bad)


def test_fast_poll_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(patches.FAST_POLL_ENV, raising=False)
    assert patches.fast_poll_setting() == 0.0  # off unless asked for
    monkeypatch.setenv(patches.FAST_POLL_ENV, "1")
    assert patches.fast_poll_setting() == patches.FAST_POLL_S


def test_prompt_stop_caps_the_queue_waits(vce_api) -> None:
    assert patches.prompt_engine_stop() is True
    q = vce_api.Queue()
    t0 = time.perf_counter()
    with pytest.raises(Empty):
        q.get(timeout=1.0)  # Flower's worker wait: at most PROMPT_WAIT_S now
    assert time.perf_counter() - t0 < 0.5
    threading.Timer(0.05, q.put, args=("m",)).start()
    got = None
    while got is None:  # Flower's loop: retry on Empty; the message is taken when it comes
        try:
            got = q.get(timeout=1.0)
        except Empty:
            pass
    assert got == "m"


def test_client_app_applies_the_engine_patches_only_in_the_engines_process() -> None:
    """flwr run: the ClientApp, imported by the engine's process, makes its Ray the run's own
    (RAY_ADDRESS=local unless set) with actors at niceness 0 (unless RAY_worker_niceness is set),
    starts Ray lean (unless SILOFL_LEAN_RAY=0), puts in the engine's message index (unless
    SILOFL_ENGINE_INDEX=0) and, with SILOFL_FAST_POLL set, the poll period; imported anywhere else (a SuperNode, a Ray actor) it
    patches nothing. Nowhere does it import the sweep (no circle:
    app.sweep imports the ClientApp's patches, never the other way round); in the engine's
    process it adds app.runtime.engine_patches and nothing else of silofl's beyond its own protocol."""
    code = ("import sys; {pre}before = set(sys.modules); import app.client_app; "
            "v = sys.modules.get('flwr.server.superlink.fleet.vce.vce_api'); "
            "rb = sys.modules.get('flwr.server.superlink.fleet.vce.backend.raybackend'); "
            "print(getattr(getattr(v, 'add_messages_to_queue', None), '_silofl_poll_s', None), "
            "getattr(getattr(v, 'add_messages_to_queue', None), '_silofl_index', None), "
            "__import__('os').environ.get('RAY_worker_niceness'), "
            "getattr(getattr(getattr(rb, 'RayBackend', None), 'init_ray', None), '_silofl_lean', False), "
            "'app.sweep' in sys.modules, "
            "','.join(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('app', 'clients'))), "
            "__import__('os').environ.get('RAY_ADDRESS'))")
    env = {"PATH": str(Path(sys.executable).parent), "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(ROOT)}
    engine = "import flwr.server.superlink.fleet.vce.vce_api; "
    elsewhere = "app,app.client_app,app.node_context,app.runtime,app.runtime.silo_protocol"
    ours = "app,app.client_app,app.node_context,app.runtime,app.runtime.engine_patches,app.runtime.silo_protocol"
    # the engine's process starts a Ray of its own (RAY_ADDRESS=local) unless a cluster is named
    # (poll period, index, actors' niceness, lean start, sweep imported, modules, RAY_ADDRESS)
    for pre, extra, expected in ((engine, {"SILOFL_FAST_POLL": "1"}, f"0.005 True 0 True False {ours} local"),
                                 (engine, {}, f"0.1 True 0 True False {ours} local"),
                                 (engine, {"SILOFL_ENGINE_INDEX": "0"}, f"None None 0 True False {ours} local"),
                                 (engine, {"RAY_worker_niceness": "5"}, f"0.1 True 5 True False {ours} local"),
                                 (engine, {"SILOFL_LEAN_RAY": "0"}, f"0.1 True 0 False False {ours} local"),
                                 (engine, {"RAY_ADDRESS": "10.0.0.5:6379"},
                                  f"0.1 True 0 True False {ours} 10.0.0.5:6379"),
                                 ("", {"SILOFL_FAST_POLL": "1"}, f"None None None False False {elsewhere} None")):
        out = subprocess.run([sys.executable, "-c", code.format(pre=pre)], cwd=ROOT, capture_output=True, text=True,
                             timeout=120, env=env | extra)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == expected.split(), (pre, extra, out.stdout)


def test_the_lean_ray_start_gives_ray_s_workers_the_drivers_path(tmp_path: Path) -> None:
    """What Flower's runtime_env was for: a Ray actor started by the patched init_ray imports a
    module that only the driver's sys.path can find (the app bundle's folder, in flwr run)."""
    pkg = tmp_path / "only_on_the_drivers_path.py"
    pkg.write_text("WHERE = 'found'\n")
    code = f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
from app.runtime.engine_patches import lean_ray_start
assert lean_ray_start()
b = RayBackend.__new__(RayBackend); b.init_args_key = "init_args"
b.init_ray({{"init_args": {{"num_cpus": 1}}}})
import ray

@ray.remote
def where():
    import only_on_the_drivers_path
    return only_on_the_drivers_path.WHERE

print(ray.get(where.remote()))
ray.shutdown()
"""
    env = {"PATH": str(Path(sys.executable).parent), "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(ROOT),
           "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "found"


@pytest.mark.slow
def test_fast_poll_keeps_numbers_and_is_faster(tmp_path: Path) -> None:
    """Two federations on one warm engine, without and with the poll patch: rounds.jsonl is the
    same but for wall_s, and the patched rounds are faster (medians; a generous bound)."""
    code = f"""
import json, statistics, sys
from app.launch import merged_run_config
from app.federation import run_federation
out = {{}}
for fast in (False, True):
    cfg = merged_run_config([]) | {{"num-rounds": 6, "outputs-dir": {str(tmp_path)!r}, "run-name": f"fast{{fast}}"}}
    res = run_federation(cfg, warm=True, fast=fast)
    out[str(fast)] = res["rounds_rows"]
print("RESULT " + json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(proc.stdout.split("RESULT ", 1)[1])
    slow, fast = rows["False"], rows["True"]
    assert without_wall(slow) == without_wall(fast) and len(fast) == 6
    median = lambda rs: sorted(float(r["wall_s"]) for r in rs[1:])[len(rs[1:]) // 2]  # noqa: E731
    assert median(fast) < median(slow), (median(fast), median(slow))


def _ray_resolves(address, temp_dir: Path):
    """What Ray's own ray.init does with ``address`` on a machine where another Ray runs (its
    address in ``temp_dir``/ray_current_cluster, as `ray start` or ray.cluster_utils write it):
    the cluster it would join, or None for a new local Ray of its own."""
    from ray._private.services import canonicalize_bootstrap_address

    return canonicalize_bootstrap_address(address, str(temp_dir))


def test_a_simulation_starts_its_own_ray_unless_a_cluster_is_named(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Another Ray on the machine (its address in ray_current_cluster). Before: the engine called
    ray.init without an address, Ray joined that cluster (`Found multiple active Ray instances ...
    Connecting to latest cluster`), and the simulation hung. Now: the sweep's init args, the lean
    start and, in flwr run's engine process, RAY_ADDRESS all say `local` (a Ray of the run's own)
    unless the user named a cluster (sweep.ray-address or RAY_ADDRESS), checked with Ray's own
    address resolution; nothing starts Ray here."""
    import ray
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    from app.federation import engine_backend_config

    (tmp_path / "ray_current_cluster").write_text("127.0.0.1:6379")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert str(_ray_resolves(None, tmp_path)).endswith(":6379")  # the cluster an address-less ray.init joined
    init = engine_backend_config(2)["init_args"]
    assert init["address"] == "local" and _ray_resolves(init["address"], tmp_path) is None
    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    assert patches.lean_ray_start()
    backend = RayBackend.__new__(RayBackend)
    backend.init_args_key = "init_args"
    backend.init_ray({"init_args": {"num_cpus": 1}})  # flwr run's engine: Flower's init args, no address
    assert calls[-1]["address"] == "local" and calls[-1]["num_cpus"] == 1
    patches.own_ray()  # the ClientApp in flwr run's engine process: for any ray.init(address=None)
    assert os.environ["RAY_ADDRESS"] == "local" and _ray_resolves(None, tmp_path) is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")  # a named cluster is joined, as before
    patches.own_ray()
    assert os.environ["RAY_ADDRESS"] == "10.0.0.5:6379"
    assert engine_backend_config(2)["init_args"] == {"address": "10.0.0.5:6379"}
    assert engine_backend_config(2, {"ray-address": "auto"})["init_args"] == {"address": "auto"}
