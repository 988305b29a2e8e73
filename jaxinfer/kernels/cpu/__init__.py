"""C++ kernels for XLA:CPU as FFI custom calls: `build` (the one loader: switch, compiler,
cached build, registration), one binding module per kernel (`attention`, `amx`, `int8`,
`gemv`, `argmax`) and their sources under ``csrc/`` (the ``.cc`` and ``.h`` files).
"""
