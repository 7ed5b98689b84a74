# NequIP: build a small model, accelerate it, run ASE molecular dynamics (seconds on a CPU).
from ase import units
from ase.build import bulk
from ase.md.langevin import Langevin
from nequip.model import NequIPGNNModel
from nequip.utils.global_state import set_global_state

from mlip_accel.integrations.ase import AcceleratedCalculator

set_global_state()  # nequip's model builders need this first (nequip-train and its calculator call it too)
model = NequIPGNNModel(
    seed=0, model_dtype="float32", type_names=["Cu"], r_max=4.0, l_max=1, num_layers=2, num_features=8,
    radial_mlp_depth=1, radial_mlp_width=8, avg_num_neighbors=40.0,
    per_type_energy_shifts={"Cu": -3.5}, per_type_energy_scales={"Cu": 0.5},
)  # random weights; a trained model comes from nequip-train (checkpoint) or nequip-package

atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)  # 32 atoms
atoms.rattle(0.05, seed=0)
# moves the model to the device (CUDA when there is a GPU) and swaps our fused convolution in, in place,
# after checking that the accelerated model gives the original's energy, forces and stress
atoms.calc = AcceleratedCalculator.from_model(model, device="auto")
print(atoms.calc.describe())  # the model, the device, what runs in each layer and why
print("backend:", atoms.calc.backend)  # "cuda": our kernels run; "reference": PyTorch (CPU, or no CuPy)

Langevin(atoms, timestep=2 * units.fs, temperature_K=300, friction=0.01 / units.fs, fixcm=False).run(20)
print(f"E = {atoms.get_potential_energy():.4f} eV after 20 steps")
