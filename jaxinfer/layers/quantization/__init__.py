"""Quantized weights: `int8` (int8 kernels with group scales: the linear and embedding
modules, their matmul and the conversion of a float parameter tree).
"""
