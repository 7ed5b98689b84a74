# MACE: build a small model, accelerate it, run ASE molecular dynamics (seconds on a CPU).
import numpy as np
import torch
from ase import units
from ase.build import bulk
from ase.md.langevin import Langevin
from mace import modules  # before e3nn: it sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1, which e3nn 0.4.4 needs

from e3nn import o3  # noqa: E402 (after mace, see above)

from mlip_accel.integrations.ase import AcceleratedCalculator

torch.manual_seed(0)
block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
model = modules.ScaleShiftMACE(
    r_max=4.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=2, interaction_cls=block,
    interaction_cls_first=block, num_interactions=2, num_elements=1, hidden_irreps=o3.Irreps("8x0e+8x1o"),
    MLP_irreps=o3.Irreps("8x0e"), gate=torch.nn.functional.silu, atomic_energies=np.array([-3.5]),
    avg_num_neighbors=40.0, atomic_numbers=[29], correlation=2, atomic_inter_scale=1.0, atomic_inter_shift=0.0,
)  # random weights; a trained model: torch.load("my.model", weights_only=False) (a pickle: trust the file)

atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)  # 32 atoms
atoms.rattle(0.05, seed=0)
# moves the model to the device (CUDA when there is a GPU) and swaps our fused convolution in, in place,
# after checking that the accelerated model gives the original's energy, forces and stress
atoms.calc = AcceleratedCalculator.from_model(model, device="auto")
print(atoms.calc.describe())  # the model, the device, what runs in each layer and why
print("backend:", atoms.calc.backend)  # "cuda": our kernels run; "reference": PyTorch (CPU, or no CuPy)

Langevin(atoms, timestep=2 * units.fs, temperature_K=300, friction=0.01 / units.fs, fixcm=False).run(20)
print(f"E = {atoms.get_potential_energy():.4f} eV after 20 steps")
