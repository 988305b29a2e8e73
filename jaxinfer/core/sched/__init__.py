"""Scheduling policies: `scheduler` (the interface every policy extends, `make_scheduler`),
`continuous` (continuous batching, first come first served), `priority` (by request priority,
with aging) and `static` (the static-batching baseline for benchmarks).
"""
