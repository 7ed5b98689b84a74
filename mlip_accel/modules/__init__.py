"""nn.Modules over the custom ops."""
from .tensor_product import TensorProduct, TensorProductConv

__all__ = ["TensorProduct", "TensorProductConv"]
