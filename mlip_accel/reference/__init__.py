"""Pure-PyTorch reference implementation of the tensor product and the fused convolution."""
from .tensor_product import conv_backward, conv_forward, tp_backward, tp_forward

__all__ = ["conv_backward", "conv_forward", "tp_backward", "tp_forward"]
