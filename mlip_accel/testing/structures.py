"""Small ASE structures of two elements for calculator, padding and MD tests (ase is imported when called)."""
from __future__ import annotations


def two_element_structures(a: str, b: str, *, lonely: bool = False) -> dict:
    """name -> Atoms with elements ``a`` and ``b``: periodic cell, 1-atom cell (many images), slab, molecule;
    with ``lonely``, also a cluster whose atoms have no neighbours at all (far from everything, one of them
    alone in the list)."""
    from ase import Atoms
    from ase.build import bulk, molecule

    cell = bulk(a, "fcc", a=3.7, cubic=True).repeat((2, 1, 1))
    cell.symbols[[1, 6]] = b
    cell.rattle(0.1, seed=1)
    tiny = bulk(a, "fcc", a=3.6)
    tiny.rattle(0.05, seed=2)
    slab = bulk(a, "fcc", a=3.7, cubic=True).repeat((2, 2, 1))
    slab.center(vacuum=4.0, axis=2)
    slab.pbc = (True, True, False)
    slab.symbols[3] = b
    slab.rattle(0.05, seed=3)
    mol = molecule("CH3OH")
    mol.symbols = [a if s in "CO" else b for s in mol.get_chemical_symbols()]
    mol.positions *= 1.6  # metal-like distances
    found = {"cell": cell, "tiny_cell": tiny, "slab": slab, "molecule": mol}
    if lonely:
        found["no_neighbours"] = Atoms(f"{a}2{b}2", positions=[[0, 0, 0], [2.4, 0.3, 0], [30, 0, 0], [0, 40, 0]])
    return found
