"""Render kernel-benchmark results (scripts/bench_kernels.py) as benchmarks/kernels.{json,md} and the
README's benchmark section. Pure Python: runs anywhere, on results saved by a GPU run.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from bench_peers import IMPLS, LABELS, PEERS

REPO = Path(__file__).resolve().parents[1]
README_START, README_END = "<!-- bench_kernels:start -->", "<!-- bench_kernels:end -->"
DIRS = ("fwd", "bwd", "dbl")
DIR_NAMES = {"fwd": "forward", "bwd": "backward", "dbl": "double backward"}
GRAPH_ORDER = ("carbon-1k", "carbon-8k", "small-molecule")
SHORT = {"e3nn": "e3nn", "cueq-uniform_1d": "cuEq-u1d", "cueq-fused_tp": "cuEq-ftp", "oeq-det": "OEQ-det",
         "oeq-atomic": "OEQ-atom", "mlip_accel-det": "ours-det", "mlip_accel-atomic": "ours-atom"}


# -- data -------------------------------------------------------------------------------------------

def _key(r: dict) -> tuple:
    return r["problem"], r["graph"], r["dtype"], r["impl"]


def from_events(events: list[dict]) -> dict:
    """Report data from the event stream bench_kernels.py writes (kernels.events.jsonl)."""
    data = {"meta": {}, "graphs": {}, "shapes": {}, "results": [], "compile": []}
    results, compile_ = {}, {}
    for ev in events:
        kind = ev.get("event")
        body = {k: v for k, v in ev.items() if k != "event"}
        if kind == "meta":
            data["meta"].update(body)
        elif kind == "graph":
            data["graphs"][ev["graph"]] = {"num_nodes": ev["num_nodes"], "num_edges": ev["num_edges"]}
        elif kind == "shape":
            data["shapes"][f"{ev['problem']}|{ev['graph']}|{ev['dtype']}"] = {
                k: ev[k] for k in ("d1", "d2", "do", "wn", "num_nodes", "num_edges", "floor_bytes")}
        elif kind == "result":
            results[_key(body)] = body
        elif kind == "compile":
            compile_[(ev["problem"], ev["dtype"])] = body
    data["results"], data["compile"] = list(results.values()), list(compile_.values())
    return data


def load(path: Path) -> dict:
    """A saved kernels.json, or the kernels.events.jsonl of a run (also of one that was cut short)."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        return from_events([json.loads(line) for line in text.splitlines() if line.strip()])
    return json.loads(text)


def merge(runs: list[dict]) -> dict:
    """Several saved runs as one (later runs win per case); meta of the last, other devices noted."""
    out = {"meta": {}, "graphs": {}, "shapes": {}, "results": [], "compile": []}
    results, compile_ = {}, {}
    devices = []
    for run in runs:
        out["meta"] = dict(run.get("meta", {}))
        devices.append(out["meta"].get("device"))
        out["graphs"].update(run.get("graphs", {}))
        out["shapes"].update(run.get("shapes", {}))
        results.update({_key(r): r for r in run.get("results", [])})
        compile_.update({(c["problem"], c["dtype"]): c for c in run.get("compile", [])})
    out["results"], out["compile"] = list(results.values()), list(compile_.values())
    if len(set(devices)) > 1:
        out["meta"]["mixed_devices"] = sorted({str(d) for d in devices})
    return out


def add_rooflines(data: dict) -> None:
    bw = data["meta"].get("copy_bandwidth_gbps")
    for rec in data["results"]:
        shape = data["shapes"].get(f"{rec['problem']}|{rec['graph']}|{rec['dtype']}")
        if not shape or not bw:
            continue
        for d, res in rec.get("directions", {}).items():
            if "median_ms" in res:
                res["floor_ms"] = shape["floor_bytes"][d] / (bw * 1e9) * 1e3
                res["roofline_frac"] = res["floor_ms"] / res["median_ms"]


def _ms(rec: dict | None, d: str) -> float | None:
    if not rec or rec.get("status") != "ok":
        return None
    return rec.get("directions", {}).get(d, {}).get("median_ms")


def _ordered(values, order):
    return sorted(values, key=lambda v: (order.index(v) if v in order else len(order), v))


def _groups(data: dict):
    """(graph, dtype) pairs present, in a stable order, and the problems in problems.json order."""
    seen_problems = []
    for r in data["results"]:
        if r["problem"] not in seen_problems:
            seen_problems.append(r["problem"])
    graphs = _ordered({r["graph"] for r in data["results"]}, GRAPH_ORDER)
    dtypes = _ordered({r["dtype"] for r in data["results"]}, ("float32", "float64"))
    return [(g, t) for g in graphs for t in dtypes], seen_problems


def _index(data: dict) -> dict:
    return {_key(r): r for r in data["results"]}


def best_peer(idx: dict, problem: str, graph: str, dtype: str, d: str):
    """(time, impl) of the fastest peer that ran this direction, or (None, None)."""
    best = (None, None)
    for impl in PEERS:
        t = _ms(idx.get((problem, graph, dtype, impl)), d)
        if t is not None and (best[0] is None or t < best[0]):
            best = (t, impl)
    return best


# -- formatting -------------------------------------------------------------------------------------

def _fmt_t(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _cell(rec: dict | None, d: str) -> str:
    if rec is None:
        return ""
    if rec.get("status") != "ok":
        return {"oom": "OOM", "unavailable": "n/a", "skipped": "skipped"}.get(rec.get("status"), "error")
    res = rec.get("directions", {}).get(d)
    if res is None:
        return ""
    if "median_ms" not in res:
        return {"oom": "OOM"}.get(res.get("status"), "error")
    frac = res.get("roofline_frac")
    return _fmt_t(res["median_ms"]) + (f" ({100 * frac:.0f}%)" if frac is not None else "")


def _err(rec: dict) -> str:
    def one(v):
        return "-" if v is None else f"{v:.0e}"
    if rec.get("status") != "ok":
        return ""
    return f"{one(rec.get('err_fwd'))} / {one(rec.get('err_bwd'))}"


def _mem(rec: dict) -> str:
    if rec.get("status") != "ok":
        return ""
    vals = [rec.get("directions", {}).get(d, {}).get("peak_mb") for d in DIRS]
    return " / ".join("-" if v is None else f"{v:.0f}" for v in vals)


def _speedups(idx, problem, graph, dtype, ours: str, peer: str | None) -> str:
    cells = []
    for d in DIRS:
        t_ours = _ms(idx.get((problem, graph, dtype, ours)), d)
        if peer is None:
            t_peer = best_peer(idx, problem, graph, dtype, d)[0]
        else:
            t_peer = _ms(idx.get((problem, graph, dtype, peer)), d)
        cells.append("-" if t_ours is None or t_peer is None else f"{t_peer / t_ours:.2f}")
    return " / ".join(cells)


def header(data: dict) -> list[str]:
    m = data["meta"]
    v = m.get("versions", {})
    peers = ", ".join(f"{k} {v[k]}" for k in ("e3nn", "cuequivariance", "cuequivariance-ops-torch-cu13",
                                              "cuequivariance-ops-torch-cu12", "openequivariance", "nequip") if k in v)
    backends = sorted({(r.get("note") or "").split(" ")[0] for r in data["results"]
                       if r["impl"].startswith("mlip_accel") and r.get("status") == "ok"} - {""})
    lines = [f"Device: **{m.get('device', '?')}** ({m.get('sms', '?')} SMs), torch {v.get('torch', '?')} "
             f"(CUDA {v.get('cuda', '?')}); {peers}; mlip_accel {v.get('mlip_accel', '?')}"
             + (f" ({', '.join(backends)})" if backends else "") + f". Run {m.get('date', '?')}.",
             f"Measured device-to-device copy: **{m.get('copy_bandwidth_gbps') or 0:.0f} GB/s** (bytes read + written)."]
    if m.get("mixed_devices"):
        lines.append(f"**Warning:** merged from runs on different devices: {', '.join(m['mixed_devices'])}.")
    return lines


def method_lines() -> list[str]:
    return [
        "Median of repeated calls timed with CUDA events, the L2 cache flushed before each call, after warm-up. "
        "fwd: the convolution; bwd: grads of x, y, w from a random output grad; dbl: grads of those grads "
        "w.r.t. x, y, w and the output grad (force training). Inputs in each library's own layout "
        "(cuEq-u1d: ir_mul, as MACE holds features; cuEq-ftp includes NequIP's two layout transposes).",
        "(n%) = share of the memory roofline: minimum bytes / copy rate, counting x, y, w (+ grad_out, "
        "cotangents) read once and every output written once; index arrays not counted.",
        "Peak MiB: allocator high-water mark above what was held before, for fwd / fwd+bwd / fwd+bwd+dbl. "
        "rel err: max |a - ref| / max |ref| against fp64 e3nn (bwd: grad_x on all nodes, grad_y and grad_w "
        "on 4096 sampled edges). setup s: construction (kernel compilation) + first call.",
    ]


def results_tables(data: dict) -> list[str]:
    idx = _index(data)
    groups, problems = _groups(data)
    lines: list[str] = []
    for graph, dtype in groups:
        g = data["graphs"].get(graph, {})
        lines += ["", f"### {graph} ({g.get('num_nodes', '?')} atoms, {g.get('num_edges', '?')} edges), {dtype}", "",
                  "| problem | implementation | fwd ms | bwd ms | dbl ms | peak MiB fwd / bwd / dbl | rel err fwd / bwd | setup s |",
                  "|---|---|---|---|---|---|---|---|"]
        notes = []
        for problem in problems:
            rows = [idx[(problem, graph, dtype, i)] for i in IMPLS if (problem, graph, dtype, i) in idx]
            for rec in rows:
                if rec.get("status") == "unavailable":
                    notes.append(f"{LABELS[rec['impl']]}: not run ({rec.get('reason', '')})")
                    continue
                label = LABELS[rec["impl"]] + (f" [{rec['note'].split(' ')[0]}]" if rec["impl"].startswith("mlip_accel")
                                               and rec.get("note") else "")
                setup = f"{rec['setup_s']:.1f}" if "setup_s" in rec else ""
                lines.append(f"| {problem} | {label} | {_cell(rec, 'fwd')} | {_cell(rec, 'bwd')} | {_cell(rec, 'dbl')} "
                             f"| {_mem(rec)} | {_err(rec)} | {setup} |")
                if rec.get("status") not in ("ok", "unavailable", "skipped"):
                    notes.append(f"{problem} {LABELS[rec['impl']]}: {rec.get('status')}: {rec.get('reason', '')}")
                for d, res in rec.get("directions", {}).items():
                    if "median_ms" not in res and res.get("status") == "error":
                        notes.append(f"{problem} {LABELS[rec['impl']]} {d}: {res.get('reason', '')}")
            floors = [next((r["directions"][d]["floor_ms"] for r in rows
                            if "floor_ms" in r.get("directions", {}).get(d, {})), None) for d in DIRS]
            if any(f is not None for f in floors):
                lines.append(f"| {problem} | *memory floor* | " + " | ".join(_fmt_t(f) for f in floors) + " | | | |")
        lines += [""] + [f"- {n}" for n in dict.fromkeys(notes)]
    return lines


def ratio_tables(data: dict) -> list[str]:
    idx = _index(data)
    groups, problems = _groups(data)
    ours = [i for i in IMPLS if i.startswith("mlip_accel")]
    peers = [p for p in PEERS if any(r["impl"] == p and r.get("status") == "ok" for r in data["results"])]
    lines = ["", "Speedup of mlip_accel = peer time / mlip_accel time (fwd / bwd / dbl); above 1: mlip_accel is faster.", "",
             "| graph | dtype | problem | mlip_accel | " + " | ".join(f"vs {SHORT[p]}" for p in peers) + " | vs best peer |",
             "|---|---|---|---|" + "---|" * (len(peers) + 1)]
    for graph, dtype in groups:
        for problem in problems:
            for o in ours:
                if _ms(idx.get((problem, graph, dtype, o)), "fwd") is None:
                    continue
                cells = [_speedups(idx, problem, graph, dtype, o, p) for p in peers]
                lines.append(f"| {graph} | {dtype} | {problem} | {SHORT[o]} | " + " | ".join(cells)
                             + f" | {_speedups(idx, problem, graph, dtype, o, None)} |")
    return lines


def compile_table(data: dict) -> list[str]:
    if not data.get("compile"):
        return []
    lines = ["", "First calls of mlip_accel (fwd + bwd + dbl, deterministic and atomic) in a fresh process, "
             "small-molecule graph: cold = empty kernel caches, warm = a new process with the disk cache filled.", "",
             "| problem | dtype | backend | cold s | warm s |", "|---|---|---|---|---|"]
    for c in data["compile"]:
        if c.get("status") == "ok":
            lines.append(f"| {c['problem']} | {c['dtype']} | {c['backend']} | {c['cold_s']:.2f} | {c['warm_s']:.2f} |")
        else:
            lines.append(f"| {c['problem']} | {c['dtype']} | error | {c.get('reason', '')[:120]} | |")
    return lines


def kernels_md(data: dict) -> str:
    lines = ["# Kernel benchmark: fused tensor-product convolution", "",
             "Made by `scripts/bench_kernels.py` (see its docstring for how to run it).", ""]
    lines += header(data) + [""] + [f"- {m}" for m in method_lines()]
    lines += ["", "## Times (ms, share of the memory roofline)"] + results_tables(data)
    lines += ["", "## mlip_accel against each peer"] + ratio_tables(data)
    if data.get("compile"):
        lines += ["", "## Compile and warm start"] + compile_table(data)
    return "\n".join(lines) + "\n"


def readme_block(data: dict) -> str:
    """The README summary: the fastest mlip_accel variant against the best peer, per problem and direction."""
    idx = _index(data)
    groups, problems = _groups(data)
    lines = header(data) + ["", "| graph | dtype | problem | mlip_accel fwd / bwd / dbl ms | best peer fwd / bwd / dbl ms "
                               "| speedup vs best peer | speedup vs e3nn |", "|---|---|---|---|---|---|---|"]
    for graph, dtype in groups:
        if graph == "small-molecule" and len(groups) > 2:
            continue  # launch-bound; in the full tables
        for problem in problems:
            ours = [min((t for t in (_ms(idx.get((problem, graph, dtype, o)), d) for o in IMPLS
                                     if o.startswith("mlip_accel")) if t is not None), default=None) for d in DIRS]
            peers = [best_peer(idx, problem, graph, dtype, d) for d in DIRS]
            e3 = [_ms(idx.get((problem, graph, dtype, "e3nn")), d) for d in DIRS]
            if all(t is None for t in ours) and all(p[0] is None for p in peers):
                continue
            sp = " / ".join("-" if o is None or p[0] is None else f"{p[0] / o:.2f}" for o, p in zip(ours, peers))
            se = " / ".join("-" if o is None or e is None else f"{e / o:.1f}" for o, e in zip(ours, e3))
            best = " / ".join(_fmt_t(p[0]) + (f" {SHORT[p[1]]}" if p[1] else "") for p in peers)
            lines.append(f"| {graph} | {dtype} | {problem} | {' / '.join(_fmt_t(t) for t in ours)} | {best} | {sp} | {se} |")
    lines += ["", "Full tables (every peer, roofline shares, memory, errors, compile times): "
                  "[benchmarks/kernels.md](benchmarks/kernels.md)."]
    return "\n".join(lines)


def rewrite_readme_section(block: str, readme: Path = REPO / "README.md") -> bool:
    text = readme.read_text()
    pattern = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        return False
    readme.write_text(pattern.sub(lambda _: f"{README_START}\n{block}\n{README_END}", text))
    return True


def write(data: dict, out_dir: Path, update_readme: bool = False) -> None:
    add_rooflines(data)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "kernels.json").write_text(json.dumps(data, indent=1))
    (out_dir / "kernels.md").write_text(kernels_md(data))
    print(f"bench_kernels: wrote {out_dir / 'kernels.json'} and {out_dir / 'kernels.md'}")
    if update_readme:
        ok = rewrite_readme_section(readme_block(data))
        print("bench_kernels: README.md " + ("updated" if ok else f"has no {README_START} marker; not updated"))


def summary_text(data: dict) -> str:
    return "\n".join(["", "== summary =="] + readme_block(data).splitlines()
                     + ["", "== all results =="] + results_tables(data) + compile_table(data))
