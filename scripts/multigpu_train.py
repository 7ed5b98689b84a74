"""Data-parallel training on several GPUs through the existing entry points, against one GPU with the same
global batch (run by scripts/multigpu_check.sh on the 2-GPU device machine).

    python scripts/multigpu_train.py nequip OUT [--devices 2] [--accelerator gpu] [--steps 6]
    python scripts/multigpu_train.py mace OUT [--devices 2] [--steps 6]      (starts torchrun itself)
    python scripts/multigpu_train.py report OUT                              (OUT/multigpu_train.{json,md})

What runs is the user's command: ``nequip-train`` with ``- modifier: enable_MlipAccel`` and Lightning's
``trainer.strategy=ddp`` (the config is the package example's, sized up and with a probe callback), and
``mlip-accel-mace-train --distributed --launcher torchrun`` under ``torchrun --nproc_per_node 2``. The probe
only watches: per rank and optimiser step, the loss, a hash of every parameter (fp32/fp64 bytes), the step
time (synchronised), peak memory on the rank's GPU and memory allocated on every other GPU, the current
device. Comparable by construction: the training set is exactly one global batch of structures with equal
atom counts, so each step's gradient is the same sum whatever the sampler's order or sharding (DDP averages
per-rank means; equal counts make that the global mean), and MACE runs without data-dependent scaling
(``--scaling no_scaling``: MACE computes it per rank's shard).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TRAIN, VALID = 12, 4  # structures; TRAIN is the global batch
# Model sizes: "small" (the harness's default: fast to compile, launch-bound on a GPU) and "medium" (a
# MACE-MP-0-medium-size MACE and a NequIP of 64 features at l_max 2: enough work per step for data-parallel
# throughput to show, issue 17's target)
MACE_SIZES = {
    "small": ["--hidden_irreps", "32x0e+32x1o", "--r_max", "4.0", "--max_ell", "2", "--correlation", "2",
              "--num_radial_basis", "6", "--radial_MLP", "[32]"],
    "medium": ["--hidden_irreps", "128x0e+128x1o", "--r_max", "6.0", "--max_ell", "3", "--correlation", "3",
               "--num_radial_basis", "8", "--radial_MLP", "[64,64,64]"],
}
NEQUIP_SIZES = {"small": dict(l_max=2, num_features=32, radial_mlp_width=32),
                "medium": dict(l_max=2, num_features=64, radial_mlp_width=64)}
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# --- the probe (imported in every rank) ---------------------------------------------------------------------

class Probe:
    """Per-rank records written to ``{out}/{tag}_rank{rank}.json`` and the final parameters to ``.pt``."""

    def __init__(self, out: str, tag: str, rank: int, world_size: int):
        import torch
        self.torch = torch
        self.path = Path(out) / f"{tag}_rank{rank}"
        self.rank, self.world_size = rank, world_size
        self.steps: list[dict] = []
        self.start = None
        self.params = None

    def device(self):
        torch = self.torch
        return torch.cuda.current_device() if torch.cuda.is_available() else None

    def begin(self):
        torch = self.torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.start = time.perf_counter()
        self.start_wall = time.time()  # when each rank entered the step: skew between ranks is time spent waiting

    def end(self, loss: float, parameters, num_samples: int):
        import hashlib
        torch = self.torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = time.perf_counter() - self.start
        flat = torch.cat([p.detach().reshape(-1).cpu() for p in parameters])
        record = {"step": len(self.steps), "loss": float(loss), "seconds": seconds, "samples": num_samples,
                  "began_unix_s": self.start_wall,
                  "param_sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16],
                  "param_norm": float(flat.double().norm())}
        if torch.cuda.is_available():
            here = torch.cuda.current_device()
            record.update(device=here, peak_bytes=torch.cuda.max_memory_allocated(here),
                          allocated_elsewhere={i: torch.cuda.memory_allocated(i)
                                               for i in range(torch.cuda.device_count()) if i != here})
        self.steps.append(record)
        self.params = flat
        self.write()

    def write(self):
        info = {"rank": self.rank, "world_size": self.world_size, "steps": self.steps, "pid": os.getpid(),
                "torch_threads": self.torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        if self.torch.cuda.is_available():
            uuid = str(self.torch.cuda.get_device_properties(self.torch.cuda.current_device()).uuid)
            info["gpu_uuid"] = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        self.path.with_suffix(".json").write_text(json.dumps(info, indent=1))
        if self.params is not None:
            self.torch.save(self.params, self.path.with_suffix(".pt"))


def _lightning_callback():
    import lightning

    class StepProbe(lightning.Callback):
        def __init__(self, out: str, tag: str):
            self.out, self.tag, self.probe = out, tag, None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self.probe is None:
                self.probe = Probe(self.out, self.tag, trainer.global_rank, trainer.world_size)
            self.probe.begin()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            # nequip returns the all-reduced loss times world_size (DDP averages gradients over ranks)
            samples = int(batch["num_atoms"].shape[0]) if "num_atoms" in batch else -1
            self.probe.end(float(loss) / trainer.world_size, pl_module.parameters(), samples)

    return StepProbe


def __getattr__(name):  # `_target_: multigpu_train.StepProbe` in the generated nequip config
    if name == "StepProbe":
        return _lightning_callback()
    raise AttributeError(name)


def _frames(count: int, seed: int, repeat: int):
    """Rattled, strained fcc Cu cells of 4 * repeat**3 atoms labelled by ASE's EMT (as the nequip example's
    make_dataset, which cannot be imported without nequip)."""
    import numpy as np
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator

    rng = np.random.default_rng(seed)
    frames = []
    for _ in range(count):
        atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((repeat,) * 3)
        deformation = np.eye(3) + 0.02 * rng.uniform(-1, 1, (3, 3))
        atoms.set_cell(atoms.cell @ (deformation + deformation.T) / 2, scale_atoms=True)
        atoms.positions += rng.normal(0.0, 0.08, atoms.positions.shape)
        atoms.calc = EMT()
        labels = dict(energy=atoms.get_potential_energy(), forces=atoms.get_forces(), stress=atoms.get_stress())
        atoms.calc = SinglePointCalculator(atoms, **labels)
        frames.append(atoms)
    return frames


def _layout(framework: str, devices: int, weak: bool) -> tuple[str, int, int]:
    """(record tag, training structures, structures per rank and step). The default keeps the global batch at
    TRAIN whatever the device count (losses comparable with one GPU); ``weak`` gives every rank TRAIN, as a
    user adding a GPU to go faster does (throughput only: another global batch, another loss)."""
    if weak and devices > 1:
        return f"{framework}_weak_{devices}", TRAIN * devices, TRAIN
    return f"{framework}_{devices}", TRAIN, TRAIN // devices


# --- nequip ---------------------------------------------------------------------------------------------------

def _env(extra=None) -> dict:
    here = str(Path(__file__).resolve().parent)
    env = dict(os.environ, **SAFE_ENV, PYTHONWARNINGS="ignore", **(extra or {}))
    env["PYTHONPATH"] = here + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _nequip_config(out: Path, devices: int, accelerator: str, steps: int, size: str = "small",
                   weak: bool = False) -> Path:
    from omegaconf import OmegaConf

    from mlip_accel.integrations.nequip import example

    cfg = OmegaConf.load(Path(example.__file__).parent / "train.yaml")
    cfg.model_dtype = "float32"
    tag, train, per_rank = _layout("nequip", devices, weak)
    cfg.max_epochs = steps  # one global batch per epoch: epochs = optimiser steps
    cfg.data.split_dataset.train, cfg.data.split_dataset.val = train, VALID
    cfg.data.train_dataloader.batch_size = per_rank
    cfg.data.val_dataloader.batch_size = max(1, VALID // devices)
    cfg.trainer.accelerator = accelerator
    cfg.trainer.devices = devices
    if devices > 1:
        cfg.trainer.strategy = "ddp"
    cfg.trainer.num_sanity_val_steps = 0
    cfg.trainer.callbacks.append({"_target_": "multigpu_train.StepProbe", "out": str(out),
                                  "tag": tag})
    model = cfg.training_module.model.model
    for key, value in NEQUIP_SIZES[size].items():
        setattr(model, key, value)
    path = out / "config" / f"train_{tag}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, path)
    return path


def run_nequip(out: Path, devices: int, accelerator: str, steps: int, atoms_repeat: int,
               size: str = "small", weak: bool = False) -> int:
    from ase.io import write

    tag, train, _ = _layout("nequip", devices, weak)
    data = out / f"cu_emt_{atoms_repeat}_{train}.xyz"
    if not data.exists():
        write(str(data), _frames(train + VALID, seed=3, repeat=atoms_repeat), format="extxyz")
    cfg = _nequip_config(out, devices, accelerator, steps, size, weak)
    exe = shutil.which("nequip-train") or shutil.which("nequip-train", path=str(Path(sys.executable).parent))
    run_dir = out / tag
    # the console script, or the module it runs (Lightning's DDP launcher re-runs either for rank 1)
    cmd = [exe] if exe else [sys.executable, "-m", "nequip.scripts.train"]
    cmd += ["-cp", str(cfg.parent), "-cn", cfg.stem, f"data_file={data}", f"hydra.run.dir={run_dir}"]
    start = time.perf_counter()
    with open(out / f"{tag}.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=out).returncode
    (out / f"{tag}.wall").write_text(f"{time.perf_counter() - start:.1f}")
    return rc


# --- MACE -----------------------------------------------------------------------------------------------------

def _mace_args(out: Path, devices: int, steps: int, device: str, atoms_repeat: int, size: str = "small",
               weak: bool = False) -> list[str]:
    tag, train, per_rank = _layout("mace", devices, weak)
    args = ["--name", "mg", "--seed", "7", "--train_file", str(out / f"mace_train_{atoms_repeat}_{train}.xyz"),
            "--valid_file", str(out / f"mace_valid_{atoms_repeat}.xyz"), "--E0s", "average", "--model", "MACE",
            *MACE_SIZES[size], "--num_interactions", "2", "--MLP_irreps", "16x0e",
            "--scaling", "no_scaling", "--batch_size", str(per_rank),
            "--valid_batch_size", str(max(1, VALID // devices)), "--max_num_epochs", str(steps),
            "--device", device, "--default_dtype", "float32", "--work_dir", str(out / tag),
            "--energy_key", "REF_energy", "--forces_key", "REF_forces", "--stress_key", "REF_stress"]
    if devices > 1:
        args += ["--distributed", "--launcher", "torchrun"]
    return args


def _cpu_distributed(argv: list[str]) -> None:
    """``--distributed --device cpu`` (the harness on a machine without GPUs): MACE opens a process group only
    for cuda/xpu and gives DDP ``device_ids``, which a CPU module refuses; open gloo, drop ``device_ids``."""
    import torch
    from mace.cli import run_train

    if "--distributed" not in argv or "cpu" not in argv[argv.index("--device") + 1:][:1]:
        return
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")

    class CpuDDP(torch.nn.parallel.DistributedDataParallel):
        def __init__(self, module, device_ids=None, **kwargs):
            super().__init__(module, **kwargs)

    run_train.DDP = CpuDDP


def _profiled(step_fn, path: Path):
    """``step_fn`` under torch.profiler (CPU and, where present, CUDA); the op table written to ``path``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        result = step_fn()
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    averages = prof.key_averages()
    path.write_text(averages.table(sort_by=key, row_limit=30) + "\n\nby CPU time\n"
                    + averages.table(sort_by="cpu_time_total", row_limit=30))
    return result


def mace_rank_main(out: str, tag: str, argv: list[str]) -> None:
    """One rank (or the single process): the entry point's main (MACE's own ``run_train.run`` for a tag
    ``mace_plain_*``, the control without mlip_accel), with the probe around MACE's take_step. The step
    numbered ``$MG_PROFILE_STEP`` (if set) runs under torch.profiler: ``{tag}_rank{rank}_profile.txt``."""
    import importlib

    mace_train = importlib.import_module("mace.tools.train")  # the module (mace.tools.train is also a function)

    from mlip_accel.integrations import mace_train as entry

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    _cpu_distributed(argv)
    probe = Probe(out, tag, rank, world)
    take_step = mace_train.take_step
    profile_step = int(os.environ.get("MG_PROFILE_STEP", -1))

    def probed_take_step(*args, **kwargs):
        model = kwargs.get("model", args[0] if args else None)
        batch = kwargs.get("batch", args[2] if len(args) > 2 else None)
        probe.begin()
        if len(probe.steps) == profile_step:
            loss, loss_dict = _profiled(lambda: take_step(*args, **kwargs),
                                        Path(out) / f"{tag}_rank{rank}_profile.txt")
        else:
            loss, loss_dict = take_step(*args, **kwargs)
        probe.end(float(loss), model.parameters(), int(batch.num_graphs))
        return loss, loss_dict

    mace_train.take_step = probed_take_step
    if tag.startswith("mace_plain"):
        from mace import tools
        from mace.cli import run_train
        run_train.run(tools.build_default_arg_parser().parse_args(argv))
    else:
        entry.main(argv)


def _mace_data(out: Path, atoms_repeat: int, train: int) -> None:
    from ase.io import write

    frames = _frames(train + VALID, seed=5, repeat=atoms_repeat)
    for atoms in frames:  # MACE reads REF_* keys
        atoms.info["REF_energy"] = atoms.calc.results["energy"]
        atoms.arrays["REF_forces"] = atoms.calc.results["forces"].copy()
        atoms.info["REF_stress"] = atoms.calc.results["stress"].copy()
        atoms.calc = None
    write(str(out / f"mace_train_{atoms_repeat}_{train}.xyz"), frames[:train], format="extxyz")
    write(str(out / f"mace_valid_{atoms_repeat}.xyz"), frames[train:], format="extxyz")


def run_mace(out: Path, devices: int, steps: int, device: str, atoms_repeat: int, plain: bool = False,
             size: str = "small", weak: bool = False) -> int:
    tag, train, _ = _layout("mace_plain" if plain else "mace", devices, weak)
    if not (out / f"mace_train_{atoms_repeat}_{train}.xyz").exists():
        _mace_data(out, atoms_repeat, train)
    me = str(Path(__file__).resolve())
    argv = _mace_args(out, devices, steps, device, atoms_repeat, size, weak)
    if plain:
        argv[argv.index("--work_dir") + 1] += "_plain"
    if devices > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={devices}", me,
               "mace-rank", str(out), tag, *argv]
    else:
        cmd = [sys.executable, me, "mace-rank", str(out), tag, *argv]
    start = time.perf_counter()
    with open(out / f"{tag}.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(
            {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}), cwd=out).returncode
    (out / f"{tag}.wall").write_text(f"{time.perf_counter() - start:.1f}")
    return rc


# --- report ---------------------------------------------------------------------------------------------------

def _load(out: Path, tag: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"{tag}_rank*.json"))]


def smi_gpus(smi: Path | None) -> dict[int, set[str]]:
    """pid -> GPU UUIDs it held memory on, from ``nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,
    used_memory --format=csv -lms ...`` output."""
    seen: dict[int, set[str]] = {}
    if smi is None or not smi.exists():
        return seen
    for line in smi.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            seen.setdefault(int(parts[0]), set()).add(parts[2])
    return seen


def steady(steps: list[dict]) -> list[dict]:
    """The steps a throughput is taken over: the second half of them (at least the steps after the first).
    The first steps load kernels, create library handles and grow the caching allocator: on the H200 MACE's
    first five took 0.4-1.9 s against 0.06 s after (``multigpu.md``), so a median over all but the first
    measured warm-up, not training."""
    return steps[max(1, len(steps) // 2):] or steps


def _rank_stats(steps: list[dict], rank: int) -> dict:
    med = statistics.median(st["seconds"] for st in steady(steps))
    return {"rank": rank, "device": steps[-1].get("device"), "median_step_s": med,
            "step_seconds": [round(st["seconds"], 4) for st in steps],
            "samples_per_step": steps[-1]["samples"], "samples_per_s": steps[-1]["samples"] / med,
            "peak_mib": steps[-1].get("peak_bytes", 0) / 2**20,
            "allocated_on_other_gpus": steps[-1].get("allocated_elsewhere")}


def compare(out: Path, framework: str, devices: int, tol: float, smi: Path | None = None,
            weak: bool = False) -> dict:
    """The multi-device run against the 1-device one. Same global batch (default): losses per step and final
    parameters against one device. ``weak`` (every rank the 1-device batch): throughput, parameters equal
    across ranks and memory only (another global batch trains another model)."""
    import torch

    from mlip_accel.testing import rel_err

    multi_tag = _layout(framework, devices, weak)[0]
    single, multi = _load(out, f"{framework}_1"), _load(out, multi_tag)
    result = {"framework": framework, "devices": devices, "tolerance_rel": tol,
              "global_batch": "per rank as on one GPU" if weak else "as on one GPU"}
    if len(single) != 1 or len(multi) != devices:
        result["error"] = f"missing rank records: {len(single)} single, {len(multi)} of {devices} ranks"
        return result
    s = single[0]["steps"]
    ranks = [r["steps"] for r in multi]
    n = min(len(s), *(len(r) for r in ranks))
    per_step = []
    for i in range(n):
        # the mean of per-rank losses: the global loss when ranks hold equal atom counts (a loss already
        # reduced over ranks, as nequip's, is the same on each rank and so its own mean)
        mean_loss = sum(r[i]["loss"] for r in ranks) / devices
        per_step.append({"step": i, "single_loss": s[i]["loss"], "multi_loss": mean_loss,
                         "rel_diff": 0.0 if weak else rel_err(torch.tensor(mean_loss), torch.tensor(s[i]["loss"])),
                         "ranks_identical_params": len({r[i]["param_sha256"] for r in ranks}) == 1})
    param_diff = 0.0 if weak else rel_err(torch.load(out / f"{multi_tag}_rank0.pt"),
                                          torch.load(out / f"{framework}_1_rank0.pt"))

    seen = smi_gpus(smi)
    foreign = {r["rank"]: sorted(seen.get(r.get("pid"), set()) - {r.get("gpu_uuid")}) for r in multi}
    result["nvidia_smi_gpus_other_than_own"] = foreign if seen else "no nvidia-smi samples"
    result.update(steps=n, per_step=per_step, max_loss_rel_diff=max(p["rel_diff"] for p in per_step),
                  params_identical_across_ranks_every_step=all(p["ranks_identical_params"] for p in per_step),
                  final_param_max_rel_diff_vs_single=param_diff,
                  single=_rank_stats(s, 0), ranks=[_rank_stats(r, k) for k, r in enumerate(ranks)])
    # how far apart the ranks entered each step: a rank entering late makes the others wait in the all-reduce
    # (their step time then holds the late rank's work between steps)
    skews = [max(r[i].get("began_unix_s", 0) for r in ranks) - min(r[i].get("began_unix_s", 0) for r in ranks)
             for i in range(1, n)]
    result["median_entry_skew_s"] = statistics.median(skews) if skews else 0.0
    total = sum(r["samples_per_s"] for r in result["ranks"])
    result["throughput_ratio"] = total / result["single"]["samples_per_s"]
    result["ok"] = (result["max_loss_rel_diff"] <= tol and result["params_identical_across_ranks_every_step"]
                    and all(not any((r["allocated_on_other_gpus"] or {}).values()) for r in result["ranks"])
                    and not (seen and any(foreign.values())))
    return result


def report(out: Path, devices: int, tol: float, smi: Path | None = None) -> int:
    results = {}
    for fw in ("nequip", "mace", "mace_plain"):
        same, weak = (list(out.glob(f"{fw}_{devices}_rank*.json")),
                      list(out.glob(f"{fw}_weak_{devices}_rank*.json")))
        # the same-batch comparison where its multi-device run exists, or where the 1-device run stands alone
        # (its multi-device run failed: reported as missing); not for a 1-device run kept for the weak rows only
        if same or (list(out.glob(f"{fw}_1_rank*.json")) and not weak):
            results[fw] = compare(out, fw, devices, tol, smi)
        if weak:
            results[f"{fw}, {TRAIN} per rank"] = compare(out, fw, devices, tol, smi, weak=True)
    (out / "multigpu_train.json").write_text(json.dumps(results, indent=1))
    lines = [f"# Data-parallel training, {devices} GPUs vs 1 (same global batch of {TRAIN} structures; rows "
             f"'{TRAIN} per rank': every rank the 1-GPU batch, throughput only)", "",
             f"Loss tolerance: relative {tol:g} (fp32). Per-rank throughput over the median time of the second "
             "half of the steps (the first ones are warm-up).", "",
             "| framework | steps | max loss rel diff | params equal across ranks | final params rel diff | "
             "1 GPU samples/s | per-rank samples/s | sum / 1 GPU | per-rank peak MiB | torch memory on other GPUs | "
             "nvidia-smi: other GPUs per rank | ok |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for fw, r in results.items():
        weak = r["global_batch"] != "as on one GPU"
        if "error" in r:
            lines.append(f"| {fw} | {r['error']} |||||||||||")
            continue
        lines.append(
            f"| {fw} | {r['steps']} | {'-' if weak else format(r['max_loss_rel_diff'], '.2e')} | "
            f"{r['params_identical_across_ranks_every_step']} | "
            f"{'-' if weak else format(r['final_param_max_rel_diff_vs_single'], '.2e')} | "
            f"{r['single']['samples_per_s']:.1f} | "
            + ", ".join(f"{x['samples_per_s']:.1f}" for x in r["ranks"]) + " | "
            + f"{r['throughput_ratio']:.2f}x | "
            + ", ".join(f"{x['peak_mib']:.0f}" for x in r["ranks"]) + " | "
            + ", ".join(str(x["allocated_on_other_gpus"]) for x in r["ranks"]) + " | "
            + f"{r['nvidia_smi_gpus_other_than_own']} | {r['ok']} |")
    (out / "multigpu_train.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if results and all(r.get("ok") for r in results.values()) else 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "mace-rank":  # under torchrun: mace-rank OUT TAG mace-arguments...
        mace_rank_main(argv[1], argv[2], argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["nequip", "mace", "report"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accelerator", default="gpu", help="nequip: gpu, or cpu to try the harness here")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=3, help="fcc Cu cubic cell repeated n x n x n (4n^3 atoms)")
    parser.add_argument("--model", choices=sorted(MACE_SIZES), default="small",
                        help="model size: small (fast harness check) or medium (throughput)")
    parser.add_argument("--single-only", action="store_true")
    parser.add_argument("--weak", action="store_true",
                        help="every rank takes the 1-GPU batch (throughput); runs only the multi-device run")
    parser.add_argument("--plain", action="store_true",
                        help="mace: MACE's own trainer without mlip_accel (the control), records mace_plain_*")
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--smi", type=Path, help="report: nvidia-smi --query-compute-apps CSV of the runs")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()  # the runs start in it (cwd=out): a relative path would not resolve there
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "report":
        return report(args.out, args.devices, args.tol, args.smi)
    rc = 0
    for devices in ([1] if args.single_only else [args.devices] if args.weak else [1, args.devices]):
        if args.what == "nequip":
            code = run_nequip(args.out, devices, args.accelerator, args.steps, args.repeat, args.model, args.weak)
        else:
            code = run_mace(args.out, devices, args.steps, "cuda" if args.accelerator == "gpu" else "cpu",
                            args.repeat, args.plain, args.model, args.weak)
        name = _layout("mace_plain" if args.what == "mace" and args.plain else args.what, devices, args.weak)[0]
        print(f"{args.what} on {devices} device(s): exit {code} (log {args.out}/{name}.log)")
        rc = rc or code
    return rc


if __name__ == "__main__":
    sys.exit(main())
