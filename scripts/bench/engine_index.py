"""The engine's message index (app.runtime.engine_patches.index_engine_messages) on and off, back
to back: CPU per silo-round and steady round wall per silo at 100 and 1,000 virtual SuperNodes.

Flower 1.42's engine looks for each virtual SuperNode's next instruction every 0.1 s with one scan
of every stored instruction per node (O(nodes x messages) per sweep); the index does the same in
one pass. Two apps, each federation in a fresh process on Flower's simulation engine
(``flwr.simulation.run_simulation``, a Ray of its own, the lean Ray start and actors at niceness 0
in both arms; only the index differs):

* ``noop``: Flower's floor, scripts/bench/noop_app (numpy only: per round a train and an evaluate
  message to every node, 167 floats each way, the server pulling every 5-50 ms);
* ``silofl``: silofl's ServerApp and ClientApp through ``app.federation.run_federation`` with the
  set-up of scripts/bench/scale_silos.py (digits, iid, MLP, ISRL-DP at eps 3, every silo every
  round, evaluation every round: the default data set, wbcd, has too few records for 1,000 silos).

Measured per federation (N nodes, R rounds): CPU (user + system) of the process tree (the
federation's process and the Ray processes it starts, sampled from /proc) per silo-round; the
steady round wall per silo (rounds.jsonl's ``wall_s`` of rounds 2..R, or round 1 when R = 1,
divided by N). Each line prints the machine's load (``uptime``), the ratio off/on is the figure.

    python -m scripts.bench.engine_index --apps noop,silofl --nodes 100,1000 --rounds 3,2

Measured on a shared 2-core machine (2 Ray actors; load 3-10 from other work), off -> on:

    =========  =====  ======  =====================  =========================
    app        nodes  rounds  CPU / silo-round (ms)  steady round / silo (ms)
    =========  =====  ======  =====================  =========================
    noop         100       3  37.9 -> 33.2 (x1.14)   6.94 -> 4.95 (x1.40)
    silofl       100       3  76.3 -> 65.4 (x1.17)   10.1 -> 8.40 (x1.21)
    noop       1,000       2  13.6 -> 9.5 (x1.44)    8.21 -> 4.29 (x1.92)
    noop       1,000       3  17.6 -> 9.0 (x1.97)    11.2 -> 4.87 (x2.29)
    silofl     1,000       2  46.2 -> 35.7 (x1.29)   36.7 -> 27.8 (x1.32)
    =========  =====  ======  =====================  =========================
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.bench.scale_silos import BASE, run_sampled

ROOT = Path(__file__).resolve().parents[2]
NOOP_DIR = ROOT / "scripts" / "bench" / "noop_app"


def _noop(nodes: int, rounds: int, out: str) -> dict[str, Any]:
    """One federation of the no-op app (in the child process)."""
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation
    from noopapp import client_app as noop_client  # type: ignore[import-not-found]
    from noopapp import server_app as noop_server  # type: ignore[import-not-found]

    from app.federation import engine_backend_config, engine_env
    from app.runtime.engine_patches import actor_niceness, index_engine_messages, lean_ray_start

    engine_env()
    actor_niceness()
    lean_ray_start()
    index_engine_messages()  # SILOFL_ENGINE_INDEX says on or off
    cfg = {"num-rounds": rounds, "num-params": 167, "poll-interval": 0.05, "outputs-dir": out,
           "run-name": "noop", "round-timeout": 1800.0}
    server = ServerApp()

    @server.main()
    def main(grid: Any, context: Any) -> None:
        context.run_config = dict(cfg)  # run_simulation gives the ServerApp an empty run config
        while len(list(grid.get_node_ids())) < nodes:  # the engine registers its nodes after the ServerApp starts
            time.sleep(0.05)
        noop_server.main(grid, context)

    run_simulation(server_app=server, client_app=noop_client.app, num_supernodes=nodes,
                   backend_config=engine_backend_config(nodes))
    rows = [json.loads(line) for line in (Path(out) / "noop" / "rounds.jsonl").read_text().splitlines() if line]
    return {"round_walls_s": [r["wall_s"] for r in rows], "answered": [r["answered"] for r in rows]}


def _silofl(nodes: int, rounds: int, out: str) -> dict[str, Any]:
    """One federation of silofl's apps (in the child process)."""
    from app.federation import run_federation
    from app.launch import merged_run_config

    overrides = BASE + [f"num-silos={nodes}", f"silos-per-round={nodes}", f"num-rounds={rounds}"]
    cfg = merged_run_config([" ".join(overrides)]) | {"outputs-dir": out, "run-name": "silofl"}
    res = run_federation(cfg, warm=False)
    return {"round_walls_s": [float(r["wall_s"]) for r in res["rounds_rows"]],
            "answered": [r.get("answered") for r in res["rounds_rows"]], "status": res["status"]}


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def measure(app: str, nodes: int, rounds: int, index: bool, timeout: float) -> dict[str, Any]:
    """One federation in a fresh process, its tree's CPU sampled until it exits."""
    cmd = [sys.executable, "-m", "scripts.bench.engine_index", "--one", app, "--nodes", str(nodes),
           "--rounds", str(rounds)]
    env = os.environ | {"OMP_NUM_THREADS": "1", "SILOFL_ENGINE_INDEX": "1" if index else "0",
                        "PYTHONPATH": os.pathsep.join([str(ROOT), str(NOOP_DIR)])}
    load_before = _load()
    row: dict[str, Any] = {"app": app, "nodes": nodes, "rounds": rounds, "index": index, "load_before": load_before}
    run = run_sampled(cmd, env, timeout=timeout)
    row |= {"process_wall_s": run.wall_s, "cpu_s": run.sampler.cpu_s(), "load_after": _load()}
    if run.timed_out:
        return row | {"failed": f"timed out after {timeout:.0f} s"}
    out, err = run.out, run.err
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    if run.returncode or line is None:
        return row | {"failed": f"rc {run.returncode}", "stderr_tail": err[-2000:]}
    res = json.loads(line[len("RESULT "):])
    walls = res["round_walls_s"]
    steady = walls[1:] or walls
    return row | res | {"cpu_ms_per_silo_round": 1000 * row["cpu_s"] / (nodes * rounds),
                        "steady_round_ms_per_silo": 1000 * sum(steady) / len(steady) / nodes}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--apps", default="noop,silofl")
    ap.add_argument("--nodes", default="100,1000")
    ap.add_argument("--rounds", default="3,2", help="rounds per federation, one per --nodes entry (or one for all)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="per federation (s)")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "bench" / "engine_index.json"))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one federation of this app, print JSON
    args = ap.parse_args(argv)
    nodes = [int(x) for x in args.nodes.split(",")]
    rounds = [int(x) for x in args.rounds.split(",")]
    rounds = rounds * len(nodes) if len(rounds) == 1 else rounds
    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            res = (_noop if args.one == "noop" else _silofl)(nodes[0], rounds[0], tmp)
        print("RESULT " + json.dumps(res), flush=True)
        return
    rows = []
    for app in args.apps.split(","):
        for n, r in zip(nodes, rounds):
            pair = []
            for index in (False, True):  # back to back: Flower's sweep, then the index
                row = measure(app, n, r, index, args.timeout)
                pair.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "stderr_tail"}), flush=True)
                if "failed" in row:
                    print(row.get("stderr_tail", ""), file=sys.stderr)
            off, on = pair
            if "failed" not in off and "failed" not in on:
                print(f"[engine_index] {app} {n} nodes x {r} rounds: CPU/silo-round {off['cpu_ms_per_silo_round']:.1f}"
                      f" -> {on['cpu_ms_per_silo_round']:.1f} ms (x{off['cpu_ms_per_silo_round'] / on['cpu_ms_per_silo_round']:.2f}),"
                      f" steady round/silo {off['steady_round_ms_per_silo']:.2f} -> {on['steady_round_ms_per_silo']:.2f} ms"
                      f" (x{off['steady_round_ms_per_silo'] / on['steady_round_ms_per_silo']:.2f}); load "
                      f"{off['load_before']} / {on['load_before']}", flush=True)
            rows += pair
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(sys.argv), "cpus": os.cpu_count(), "rows": rows}, indent=1))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
