"""Cost of every sketch kind on ResNet-18's parameter layout (the paper's Table 1; issue #4).

For torchvision ``resnet18(num_classes=10)`` (the shapes of ``named_parameters()``, n = 11.7M;
built on the meta device, so no weights are allocated), a random N(0, 1) float32 "gradient" and
k/n = ``--ratio`` (0.5), every kind in ``app.sketch.SKETCH_KINDS`` is run layer-wise, plus
whole-vector rows for SRHT and SRFT; ``adaptive`` picks its own k from ``--epsilon`` (0.3).

Columns (one row per kind and layout of S):

* ``draw S``: ``LinearSketch.prepare("cpu")`` on a fresh sketch object, i.e. building the cached
  O(n) structures (signs, sampled rows, hash buckets, Kronecker factors, FJLT core) from the
  round's seed. Dense kinds cache nothing: they regenerate S inside every compress/decompress.
  Every round has a new S, so a silo pays draw + compress and the server draw + decompress.
* ``compress`` / ``decompress``: ``sketch.compress(x)`` / ``sketch.decompress(payload)`` after
  ``draw S``, wall clock (``time.perf_counter``), median of ``--repeats`` repetitions (each a
  new round, so a new S), in a fresh subprocess per row with one torch thread.
* ``peak mem``: the peak of the process's resident memory during draw S + compress (resp.
  draw S + decompress), minus the resident memory just before (the gradient, resp. the payload,
  already allocated): the kernel's high-water mark ``VmHWM`` is reset through
  ``/proc/self/clear_refs`` before the call and read after it, in its own fresh subprocess run
  with glibc's ``MALLOC_MMAP_THRESHOLD_=65536``, so that freed buffers leave the resident set and
  the mark follows live memory (torch's CPU allocations are plain mallocs). Given in MiB and as
  a multiple of the gradient's size (4n bytes).
* ``state``: ``sketch.state_bytes`` (what must be stored between rounds beyond the seed; only
  PowerSGD has any) and ``cache``: bytes of the regenerable per-round structures.
* ``uplink``: payload floats (``payload_size``) and MiB as float32.

Dense Gaussian / Rademacher (time ~ sum_l k_l n_l ~ 10^13 multiply-adds here) cannot finish on a
CPU: they are timed on a prefix of the layers whose work fits ``--cap`` seconds and the times are
extrapolated linearly in ``W = sum_l k_l n_l`` (marked "extrap."). Their memory is measured on the
full layout for the first ``--probe-seconds`` of the real call (then the process is killed), plus
an upper bound for what the rest of the call can add (the payload parts and their
concatenation, resp. the whole output vector and one layer's adjoint), marked "<=". FJLT with its default sparsity
``q = log2(m')^2 / m'`` has ``nnz = sum_l q_l k_l m'_l`` (~ k log^2 m') nonzeros, far beyond
this machine's memory at k/n = 0.5: it is timed and memory-profiled on a prefix of the layers and
both are extrapolated linearly in nnz (marked "extrap.").

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python -m scripts.bench.sketch_cost [--ratio 0.5] [--kinds srht,randk]
        [--repeats 3] [--cap 60] [--quick]

The full run takes about 5 minutes on one thread of the project's 2-core machine. ``--quick`` uses
a tiny layout and measures in-process (a smoke test: seconds). Prints a markdown
table and the two target checks of the issue as PASS/FAIL lines.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from app.sketch import SKETCH_KINDS, Sketch, make_sketch
from app.sketch.base import LinearSketch
from app.sketch.dense import DenseOperator
from app.sketch.fjlt import FJLTOperator

#: Kinds whose S is a dense matrix regenerated on every call (the issue's memory check).
DENSE_KINDS = ("gaussian", "rademacher", "adaptive")
#: A tiny layout for --quick (conv kernel, bias, matrix, bias): n = 4608 + 32 + 2880 + 10.
QUICK_LAYOUT: list[tuple[int, ...]] = [(32, 16, 3, 3), (32,), (10, 288), (10,)]
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
FJLT_BYTES_PER_NNZ_EST = 28  # int64 row + int64 col + float32 value cached, + int64 position at build
MIB = float(1 << 20)


# --------------------------------------------------------------------------------------------
# layouts and sketches


def resnet18_layout(num_classes: int = 10) -> list[tuple[int, ...]]:
    """Shapes of ``torchvision.models.resnet18(num_classes)``'s ``named_parameters()`` (meta device)."""
    import torchvision

    with torch.device("meta"):
        model = torchvision.models.resnet18(num_classes=num_classes)
    return [tuple(p.shape) for _, p in model.named_parameters()]


def layout_size(layout: Sequence[Sequence[int]]) -> int:
    return sum(math.prod(s) for s in layout)


def build(kind: str, layout: Sequence[Sequence[int]], *, ratio: float, epsilon: float,
          layerwise: bool, seed: int, round: int) -> Sketch:
    """The sketch of one table row (``adaptive`` uses ``epsilon``, every other kind ``ratio``)."""
    if kind == "adaptive":
        return make_sketch(kind, layout, epsilon=epsilon, seed=seed, round=round, layerwise=layerwise)
    if kind == "powersgd":
        return make_sketch(kind, layout, ratio=ratio, seed=seed, round=round)
    return make_sketch(kind, layout, ratio=ratio, seed=seed, round=round, layerwise=layerwise)


def dense_work(sketch: Sketch) -> int:
    """``W = sum k_b m_b`` over the dense blocks (the multiply-adds and random draws of one call)."""
    if not isinstance(sketch, LinearSketch):
        return 0
    return sum(op.k * op.m for *_, op in sketch.blocks if isinstance(op, DenseOperator))


def fjlt_nnz(sketch: Sketch) -> float:
    """Expected nonzeros of the FJLT cores, ``sum q_b k_b m'_b``."""
    if not isinstance(sketch, LinearSketch):
        return 0.0
    return sum(op.q * op.k * op.m_pad for *_, op in sketch.blocks if isinstance(op, FJLTOperator))


def cache_bytes(sketch: Sketch) -> int:
    """Bytes of the cached (regenerable) per-round structures after ``prepare``."""
    if not isinstance(sketch, LinearSketch):
        return 0
    return sum(t.numel() * t.element_size() for *_, op in sketch.blocks
               for t in (op._cache or {}).values())


def prepare(sketch: Sketch) -> None:
    if isinstance(sketch, LinearSketch):
        sketch.prepare("cpu")


def prefix_layout(layout: Sequence[Sequence[int]], cost: Any, budget: float) -> list[tuple[int, ...]]:
    """The longest prefix of ``layout`` (at least one layer) with ``cost(prefix) <= budget``."""
    out = [tuple(layout[0])]
    for shape in layout[1:]:
        if cost(out + [tuple(shape)]) > budget:
            break
        out.append(tuple(shape))
    return out


# --------------------------------------------------------------------------------------------
# memory: the resident-set high-water mark of this process


def _status_kb(field: str, pid: int | str = "self") -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(m.group(1)) if m else -1


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak() -> int:
    """Free what can be freed, reset ``VmHWM`` to ``VmRSS`` and return the resident kB now."""
    _trim()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # no permission (or no /proc): the mark keeps earlier peaks, so it over-reports
        pass
    return _status_kb("VmRSS")


def peak_since(base_kb: int) -> int:
    """Bytes by which the resident high-water mark rose above ``base_kb`` since ``reset_peak``."""
    return max(0, _status_kb("VmHWM") - base_kb) * 1024


# --------------------------------------------------------------------------------------------
# measurements (each runs in a fresh child process, or in-process with --quick)


def measure_times(spec: dict[str, Any]) -> dict[str, Any]:
    """Median draw / compress / decompress seconds over ``spec["repeats"]`` rounds."""
    torch.set_num_threads(1)
    layout = [tuple(s) for s in spec["layout"]]
    n = layout_size(layout)
    x = torch.randn(n, generator=torch.Generator().manual_seed(spec["seed"]))
    draws, comps, decs, states, caches = [], [], [], [], []
    sk = None
    for rep in range(spec["repeats"]):
        sk = build(spec["kind"], layout, ratio=spec["ratio"], epsilon=spec["epsilon"],
                   layerwise=spec["layerwise"], seed=spec["seed"], round=rep)
        t0 = time.perf_counter()
        prepare(sk)
        t1 = time.perf_counter()
        y = sk.compress(x)
        t2 = time.perf_counter()
        states.append(sk.state_bytes)
        caches.append(cache_bytes(sk))
        server = build(spec["kind"], layout, ratio=spec["ratio"], epsilon=spec["epsilon"],
                       layerwise=spec["layerwise"], seed=spec["seed"], round=rep)
        prepare(server)
        t3 = time.perf_counter()
        z = server.decompress(y)
        t4 = time.perf_counter()
        assert z.shape == (n,)
        draws.append(t1 - t0)
        comps.append(t2 - t1)
        decs.append(t4 - t3)
        del server, y, z
    assert sk is not None
    return {"n": n, "k": sk.k, "payload": sk.payload_size, "draw": statistics.median(draws),
            "compress": statistics.median(comps), "decompress": statistics.median(decs),
            "state_bytes": max(states), "cache_bytes": max(caches), "reps": spec["repeats"],
            "work": dense_work(sk), "nnz": fjlt_nnz(sk)}


def measure_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """Peak extra resident bytes of draw S + compress, and of draw S + decompress (one round)."""
    torch.set_num_threads(1)
    layout = [tuple(s) for s in spec["layout"]]
    n = layout_size(layout)
    x = torch.randn(n, generator=torch.Generator().manual_seed(spec["seed"]))
    kw = dict(ratio=spec["ratio"], epsilon=spec["epsilon"], layerwise=spec["layerwise"],
              seed=spec["seed"], round=0)
    sk = build(spec["kind"], layout, **kw)
    base = reset_peak()
    prepare(sk)
    y = sk.compress(x)
    peak_c = peak_since(base)
    del sk
    server = build(spec["kind"], layout, **kw)
    base = reset_peak()
    prepare(server)
    z = server.decompress(y)
    peak_d = peak_since(base)
    del z, server
    return {"peak_compress": peak_c, "peak_decompress": peak_d}


def probe_child(spec: dict[str, Any]) -> None:
    """Start the real full-size call after printing ``READY <resident kB>``; the parent reads the
    high-water mark after ``--probe-seconds`` and kills this process."""
    torch.set_num_threads(1)
    layout = [tuple(s) for s in spec["layout"]]
    sk = build(spec["kind"], layout, ratio=spec["ratio"], epsilon=spec["epsilon"],
               layerwise=spec["layerwise"], seed=spec["seed"], round=0)
    gen = torch.Generator().manual_seed(spec["seed"])
    arg = torch.randn(sk.n if spec["op"] == "compress" else sk.payload_size, generator=gen)
    base = reset_peak()
    print(f"READY {base}", flush=True)
    if spec["op"] == "compress":
        sk.compress(arg)
    else:
        sk.decompress(arg)
    print("DONE", flush=True)


def _child_cmd(spec: dict[str, Any]) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.update(extra or {})
    return env


def run_child(spec: dict[str, Any], *, mmap: bool) -> dict[str, Any]:
    """Run ``measure_times`` / ``measure_memory`` in a fresh interpreter; its last line is JSON."""
    proc = subprocess.run(_child_cmd(spec), capture_output=True, text=True,
                          env=_child_env(MMAP_ENV if mmap else None), check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"child {spec['what']} {spec['kind']} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_probe(spec: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Peak extra resident bytes of the full-size call during its first ``seconds``."""
    proc = subprocess.Popen(_child_cmd(dict(spec, what="probe")), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_child_env(MMAP_ENV))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError(f"probe {spec['kind']} failed: {line}{proc.stderr.read() if proc.stderr else ''}")
        base = int(line.split()[1])
        t0 = time.perf_counter()
        finished = False
        while time.perf_counter() - t0 < seconds:
            if proc.poll() is not None:
                finished = True
                break
            hwm = _status_kb("VmHWM", proc.pid)
            time.sleep(0.05)
        if not finished:
            hwm = _status_kb("VmHWM", proc.pid)
        return {"peak": max(0, hwm - base) * 1024, "finished": finished,
                "seconds": time.perf_counter() - t0}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


# --------------------------------------------------------------------------------------------
# the table


def dense_rate() -> float:
    """Multiply-adds (with their random draws) per second of a dense Gaussian block, for choosing
    the timed prefix only (never reported as a measurement)."""
    sk = make_sketch("gaussian", [(1 << 20,)], k=16, seed=0, round=0)
    x = torch.randn(1 << 20)
    sk.compress(x)
    t0 = time.perf_counter()
    sk.compress(x)
    return dense_work(sk) / (time.perf_counter() - t0)


def row_specs(kinds: Sequence[str]) -> list[tuple[str, bool]]:
    """(kind, layerwise) rows: every kind layer-wise, plus SRHT and SRFT on the whole vector."""
    rows = [(kind, True) for kind in kinds]
    rows += [(kind, False) for kind in ("srht", "srft") if kind in kinds]
    return rows


def fmt_s(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def fmt_mem(b: float, grad: float, prefix: str = "") -> str:
    return f"{prefix}{b / MIB:,.1f} MiB ({prefix}{b / grad:.2f}x)"


def measure_row(kind: str, layerwise: bool, layout: list[tuple[int, ...]], args: argparse.Namespace,
                rate: float) -> dict[str, Any]:
    """All measurements of one table row (time, memory, sizes), exact or extrapolated."""
    n = layout_size(layout)
    full = build(kind, layout, ratio=args.ratio, epsilon=args.epsilon, layerwise=layerwise,
                 seed=args.seed, round=0)
    base_spec = {"kind": kind, "layerwise": layerwise, "ratio": args.ratio, "epsilon": args.epsilon,
                 "seed": args.seed, "repeats": args.repeats}
    row: dict[str, Any] = {"kind": kind, "layerwise": layerwise, "n": n, "k": full.k,
                           "payload": full.payload_size, "ratio": full.k / n, "how": "measured"}
    w_full, nnz_full = dense_work(full), fjlt_nnz(full)
    row["work"], row["nnz"] = w_full, nnz_full
    reps = args.repeats

    def cost_w(lay: list[tuple[int, ...]]) -> float:
        return dense_work(build(kind, lay, ratio=args.ratio, epsilon=args.epsilon,
                                layerwise=layerwise, seed=args.seed, round=0))

    def cost_nnz(lay: list[tuple[int, ...]]) -> float:
        return fjlt_nnz(build(kind, lay, ratio=args.ratio, epsilon=args.epsilon,
                              layerwise=layerwise, seed=args.seed, round=0))

    too_slow = w_full / rate * 2 * reps > args.cap and kind in ("gaussian", "rademacher")
    too_big = nnz_full * FJLT_BYTES_PER_NNZ_EST > args.fjlt_max_gib * (1 << 30)
    if args.quick:
        too_slow = too_big = False

    if too_slow:  # time a prefix, extrapolate in W; memory: probe of the full call
        sub = prefix_layout(layout, cost_w, rate * args.cap / (2 * reps))
        t = run_child(dict(base_spec, what="times", layout=sub), mmap=False)
        scale = w_full / t["work"]
        # draw S stays as measured on the prefix: dense kinds cache nothing (S is regenerated
        # inside every call), so it is per-layer bookkeeping and does not scale with W
        row.update({"draw": t["draw"], "compress": t["compress"] * scale,
                    "decompress": t["decompress"] * scale, "state_bytes": t["state_bytes"],
                    "cache_bytes": 0, "extrap": True, "draw_measured": True,
                    "how": (f"time extrap. x{scale:,.0f} in sum k_l n_l from the first {len(sub)} "
                            f"layers (n={layout_size(sub):,}, {reps} reps); memory: full call, "
                            f"first {args.probe_seconds:g} s + bound")})
        pc = run_probe(dict(base_spec, layout=layout, op="compress"), args.probe_seconds)
        pd = run_probe(dict(base_spec, layout=layout, op="decompress"), args.probe_seconds)
        # what the rest of the call can add at most: compress keeps the payload parts and
        # concatenates them (2 k floats); decompress fills its output (n floats, allocated with
        # torch.empty, so resident only once written) and allocates one layer's adjoint
        row["peak_compress"] = pc["peak"] + 2 * full.payload_size * 4
        row["peak_decompress"] = pd["peak"] + (n + max(math.prod(s) for s in layout)) * 4
        row["mem_bound"] = True
        row["probe"] = {"compress": pc, "decompress": pd}
        return row
    if too_big:  # FJLT: time and memory on a prefix, extrapolated in nnz
        sub = prefix_layout(layout, cost_nnz, args.fjlt_prefix_nnz)
        spec = dict(base_spec, layout=sub)
        t = run_child(dict(spec, what="times"), mmap=False)
        m = run_child(dict(spec, what="memory"), mmap=True)
        scale = nnz_full / t["nnz"]
        row.update({"draw": t["draw"] * scale, "compress": t["compress"] * scale,
                    "decompress": t["decompress"] * scale, "state_bytes": t["state_bytes"],
                    "cache_bytes": t["cache_bytes"] * scale, "extrap": True,
                    "peak_compress": m["peak_compress"] * scale,
                    "peak_decompress": m["peak_decompress"] * scale,
                    "how": (f"time and memory extrap. x{scale:,.0f} in nnz = sum q k m' "
                            f"({nnz_full:.3g} nonzeros) from the first {len(sub)} layers "
                            f"(n={layout_size(sub):,}, {reps} reps); not run: too big for 24 GiB")})
        return row
    spec = dict(base_spec, layout=layout)
    if args.quick:
        t = measure_times(spec)
        m = measure_memory(spec)
        row["how"] = "measured (in-process, --quick)"
    else:
        t = run_child(dict(spec, what="times"), mmap=False)
        m = run_child(dict(spec, what="memory"), mmap=True)
    row.update({k: t[k] for k in ("draw", "compress", "decompress", "state_bytes", "cache_bytes")})
    row.update(m)
    row["extrap"] = False
    return row


def render(rows: list[dict[str, Any]], n: int) -> str:
    grad = 4.0 * n
    head = ("| kind | S | k (floats) | k/n | uplink MiB | draw S (s) | compress (s) | decompress (s) "
            "| peak mem compress | peak mem decompress | state | cache MiB | how |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        ex = " (extrap.)" if r.get("extrap") else ""
        dex = "" if r.get("draw_measured") else ex
        pre = "<= " if r.get("mem_bound") else ""
        mex = " (extrap.)" if r.get("extrap") and not r.get("mem_bound") else ""
        lines.append(
            f"| {r['kind']} | {'layer-wise' if r['layerwise'] else 'whole vector'} | {r['payload']:,} "
            f"| {r['ratio']:.3g} | {r['payload'] * 4 / MIB:,.2f} | {fmt_s(r['draw'])}{dex} "
            f"| {fmt_s(r['compress'])}{ex} | {fmt_s(r['decompress'])}{ex} "
            f"| {fmt_mem(r['peak_compress'], grad, pre)}{mex} "
            f"| {fmt_mem(r['peak_decompress'], grad, pre)}{mex} "
            f"| {r['state_bytes']:,} B | {r['cache_bytes'] / MIB:,.1f}{mex} | {r['how']} |")
    return "\n".join(lines)


def checks(rows: list[dict[str, Any]], n: int) -> list[tuple[str, bool, str]]:
    """The issue's two targets: (name, passed, numbers)."""
    out: list[tuple[str, bool, str]] = []
    by = {(r["kind"], r["layerwise"]): r for r in rows}
    srht, randk = by.get(("srht", True)), by.get(("randk", True))
    if srht and randk:
        def total(r: dict[str, Any]) -> float:  # silo: draw + compress; server: draw + decompress
            return 2 * r["draw"] + r["compress"] + r["decompress"]

        ratio = total(srht) / total(randk)
        warm = (srht["compress"] + srht["decompress"]) / (randk["compress"] + randk["decompress"])
        out.append(("layer-wise SRHT compress+decompress within 3x of RandK's time", ratio <= 3.0,
                    f"SRHT {total(srht):.3f} s vs RandK {total(randk):.3f} s per round "
                    f"(2 x draw S + compress + decompress): {ratio:.2f}x; without drawing S: "
                    f"{srht['compress'] + srht['decompress']:.3f} s vs "
                    f"{randk['compress'] + randk['decompress']:.3f} s = {warm:.2f}x"))
    dense = [r for r in rows if r["kind"] in DENSE_KINDS]
    if dense:
        grad = 4.0 * n
        worst = max(dense, key=lambda r: max(r["peak_compress"], r["peak_decompress"]))
        peak = max(worst["peak_compress"], worst["peak_decompress"])
        parts = ", ".join(f"{r['kind']} {'<= ' if r.get('mem_bound') else ''}"
                          f"{max(r['peak_compress'], r['peak_decompress']) / grad:.2f}x"
                          for r in dense)
        out.append(("no dense kind's peak memory above 3x the gradient's size", peak <= 3 * grad,
                    f"gradient {grad / MIB:.1f} MiB; peak extra memory / gradient: {parts} "
                    f"(worst {worst['kind']}: {peak / MIB:.1f} MiB)"))
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ratio", type=float, default=0.5, help="k/n of every kind but adaptive (0.5)")
    p.add_argument("--epsilon", type=float, default=0.3, help="target distortion of adaptive (0.3)")
    p.add_argument("--kinds", default=",".join(SKETCH_KINDS), help="comma-separated kinds (all)")
    p.add_argument("--repeats", type=int, default=3, help="repetitions per row, median reported (3)")
    p.add_argument("--cap", type=float, default=60.0,
                   help="seconds for all repetitions of a dense kind's timed prefix (60)")
    p.add_argument("--probe-seconds", type=float, default=10.0,
                   help="seconds of the full-size dense call whose peak memory is read (10)")
    p.add_argument("--fjlt-max-gib", type=float, default=2.0,
                   help="FJLT runs in full only if nnz * 28 B is below this many GiB (2)")
    p.add_argument("--fjlt-prefix-nnz", type=float, default=2e7,
                   help="nonzeros of the FJLT prefix that is measured when it cannot run in full")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny layout, in-process, 1 repetition")
    p.add_argument("--json", default="", help="also write the rows to this JSON file")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in SKETCH_KINDS]
    if bad:
        p.error(f"unknown kinds {bad}; choose from {', '.join(SKETCH_KINDS)}")
    args.kinds = kinds
    if args.quick:
        args.repeats = 1
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns ``{"rows", "checks", "n", "table"}`` (and prints them)."""
    args = parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        fn = {"times": measure_times, "memory": measure_memory}.get(spec["what"])
        if fn is None:
            probe_child(spec)
            return {}
        print(json.dumps(fn(spec)), flush=True)
        return {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        layout = QUICK_LAYOUT if args.quick else resnet18_layout()
        n = layout_size(layout)
        rate = dense_rate()
        print(f"# Sketch cost: {'quick layout' if args.quick else 'ResNet-18 (num_classes=10)'}, "
              f"n = {n:,} parameters in {len(layout)} tensors, gradient {4 * n / MIB:.1f} MiB (float32), "
              f"k/n = {args.ratio}, adaptive eps = {args.epsilon}")
        print(f"# {datetime.date.today()}, {platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} CPUs, torch {torch.__version__}, 1 thread, median of "
              f"{args.repeats} repetition(s); dense prefix rate {rate / 1e6:.0f}M multiply-adds/s",
              flush=True)
        rows = []
        for kind, layerwise in row_specs(args.kinds):
            t0 = time.perf_counter()
            rows.append(measure_row(kind, layerwise, layout, args, rate))
            print(f"#   {kind} ({'layer-wise' if layerwise else 'whole vector'}) "
                  f"done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        table = render(rows, n)
        print()
        print(table)
        print()
        print("Peak memory = rise of the resident-set high-water mark (VmHWM, reset via "
              "/proc/self/clear_refs) over the resident size just before the call, in a fresh "
              "process with MALLOC_MMAP_THRESHOLD_=65536" if not args.quick else
              "Peak memory: in-process VmHWM rise (--quick: approximate)")
        results = checks(rows, n)
        for name, ok, numbers in results:
            print(f"{'PASS' if ok else 'FAIL'}: {name}: {numbers}")
        out = {"rows": rows, "checks": results, "n": n, "table": table}
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        return out
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    main(sys.argv[1:])
