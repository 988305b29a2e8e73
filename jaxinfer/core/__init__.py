"""The JAX-free decisions of serving: the host state of a request (`request`), the one stop
check (`stop`), prompt logprobs' bookkeeping (`prompt_logprobs`), the KV blocks (`kv_cache`)
and the scheduling policies (`sched`). Nothing here imports JAX; a test checks it.
"""
