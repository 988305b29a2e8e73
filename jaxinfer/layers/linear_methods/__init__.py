"""The linear methods, one file each (`jaxinfer.layers.linear` has the interface and registry)."""
