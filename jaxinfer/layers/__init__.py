"""Model building blocks the models compose and the execution plan (`jaxinfer.platform`) picks
implementations of: attention backends (`jaxinfer.layers.attention`), linear methods
(`jaxinfer.layers.linear`)."""
