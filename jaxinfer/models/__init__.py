"""Model families: one decoder module per family (`llama`: Llama and Gemma 3), the registry of
architectures (`registry`, `family` and one ``<family>_family`` entry each: names, config
hooks, tensor maps), the parameter trees (`params`) and their layouts (`layer_layout`).
Models compose `jaxinfer.layers` and never import kernels or ask which hardware they run on.
"""
