"""Where the hardware choice lives: the CPU's feature flags (`cpu_features`), what ``--dtype auto``
means (`dtype`) and the `ExecutionPlan` resolved once per engine (`execution_plan`). Importing
the package imports no JAX (`jaxinfer.config` and the host-side tools read `dtype`)."""
