"""nn.Modules over the custom ops."""
from .tensor_product import TensorProduct, TensorProductConv, TensorSquare

__all__ = ["TensorProduct", "TensorProductConv", "TensorSquare"]
