"""Several servers behind one address: ``python -m jaxinfer.cluster --instances N [server flags]``.

`launcher` starts, watches, restarts and stops the instances; `cli` is its command line;
`haproxy_config` renders the balancer's configuration (the routing policy); `haproxy_runtime`
finds or installs ``haproxy`` and talks to its admin socket.
"""
