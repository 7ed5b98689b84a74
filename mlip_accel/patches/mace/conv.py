"""The fused convolution in the shape MACE's interaction blocks call when they have ``conv_fusion`` set.

A block with a ``conv_fusion`` attribute calls ``self.conv_tp(node_feats, edge_attrs, tp_weights, edge_index)``
and expects the messages already summed onto the receivers (``edge_index[1]``) from the senders
(``edge_index[0]``): the convention MACE uses to plug in cuEquivariance and OpenEquivariance. This module
does not import MACE, so that an accelerated model unpickles wherever mlip_accel and MACE are installed.
"""
from __future__ import annotations

import torch
from torch import nn

from ...graph import EdgeSortCache
from ...modules import TensorProductConv
from ..common import conv_on_shared_graph

# The replaced e3nn module lives on as a child of this name: its state_dict entries keep MACE's keys and
# restoring the plain block is a swap back.
E3NN_CHILD = "e3nn_tp"


def _save_as_plain(module, state_dict, prefix, local_metadata) -> None:
    """state_dict post-hook: the e3nn child's entries appear under the block's ``conv_tp.`` as in plain MACE."""
    inner = prefix + E3NN_CHILD + "."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)


def _load_from_plain(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                     error_msgs) -> None:
    """load_state_dict pre-hook: the inverse of :func:`_save_as_plain` (accepts both layouts)."""
    inner = prefix + E3NN_CHILD + "."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)


class MACEFusedConv(nn.Module):
    """Drop-in ``conv_tp`` for a MACE interaction block with ``conv_fusion`` set.

    ``forward(node_feats, edge_attrs, tp_weights, edge_index)`` equals MACE's
    ``scatter_sum(e3nn_tp(node_feats[edge_index[0]], edge_attrs, tp_weights), edge_index[1], dim_size=N)``
    computed by :class:`mlip_accel.TensorProductConv`. Its ``state_dict`` is the replaced e3nn module's,
    under the same keys, so checkpoints are interchangeable with the plain model.
    """

    # its forward hands a harmonics placeholder (patches.harmonics) to conv_on_shared_graph, which reads it
    takes_harmonics_placeholder = True

    def __init__(self, e3nn_tp: nn.Module, graphs: EdgeSortCache, backend: str = "auto",
                 deterministic: bool = True):
        super().__init__()
        self.conv = TensorProductConv.from_e3nn(e3nn_tp, backend=backend, deterministic=deterministic)
        self.add_module(E3NN_CHILD, e3nn_tp)
        self.graphs = graphs
        self.register_state_dict_post_hook(_save_as_plain)
        self.register_load_state_dict_pre_hook(_load_from_plain)

    @property
    def options(self) -> dict:
        return {"backend": self.conv.backend, "deterministic": self.conv.deterministic}

    def set_options(self, backend: str, deterministic: bool) -> None:
        """Run with other options (same parameters, same shared edge graph): what accelerating again sets."""
        self.conv.backend, self.conv.deterministic = backend, deterministic

    @property
    def e3nn_module(self) -> nn.Module:
        return getattr(self, E3NN_CHILD)

    # what MACE and its tools read off a conv_tp
    @property
    def weight_numel(self) -> int:
        return self.conv.weight_numel

    @property
    def irreps_in1(self):
        return self.e3nn_module.irreps_in1

    @property
    def irreps_in2(self):
        return self.e3nn_module.irreps_in2

    @property
    def irreps_out(self):
        return self.e3nn_module.irreps_out

    def forward(self, node_feats: torch.Tensor, edge_attrs: torch.Tensor, tp_weights: torch.Tensor,
                edge_index: torch.Tensor) -> torch.Tensor:
        if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError("edge_index must be a (2, num_edges) tensor of (sender, receiver) ids, got "
                             f"{tuple(edge_index.shape) if isinstance(edge_index, torch.Tensor) else type(edge_index)}")
        return conv_on_shared_graph(self.conv, self.graphs, node_feats, edge_attrs, tp_weights, edge_index[1],
                                    edge_index[0])


def harmonics_readers(model) -> tuple:
    """The interaction blocks of ``model`` when they alone read its edge harmonics, each through a
    :class:`MACEFusedConv` whose problem takes them as the walks evaluate them (exact MACE model and block types:
    :func:`~.radial_embedding.lazy_readers`), else ()."""
    from ...codegen.tensor_product import harmonics_mismatch
    from ..harmonics import AcceleratedSphericalHarmonics
    from .radial_embedding import lazy_readers

    harmonics = getattr(model, "spherical_harmonics", None)
    blocks = lazy_readers(model)
    if not isinstance(harmonics, AcceleratedSphericalHarmonics) or not all(
            getattr(b.conv_tp, "takes_harmonics_placeholder", False) and getattr(b, "conv_fusion", None) is not None
            and harmonics_mismatch(b.conv_tp.conv.problem, harmonics.problem) is None for b in blocks):
        return ()
    return blocks


def set_harmonics_readers(model) -> None:
    """``model``'s accelerated harmonics told which blocks alone read them (:func:`harmonics_readers`): inference
    calls then leave Y to the walks of the blocks whose radial tables they read (patches.harmonics)."""
    from ..harmonics import AcceleratedSphericalHarmonics

    harmonics = getattr(model, "spherical_harmonics", None)
    if isinstance(harmonics, AcceleratedSphericalHarmonics):
        harmonics.readers = harmonics_readers(model)
