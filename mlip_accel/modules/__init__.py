"""nn.Modules over the custom ops."""
from .spherical_harmonics import SphericalHarmonics
from .tensor_product import TensorProduct, TensorProductConv, TensorSquare

__all__ = ["SphericalHarmonics", "TensorProduct", "TensorProductConv", "TensorSquare"]
