"""The request lifecycle, one step at a time: `llm_engine` (`LLMEngine`: add, schedule, execute,
update, output), `async_engine` (the engine thread behind the HTTP server), `protocol` (the
`Engine` interface the front doors call), `admission`, `output_processor`, `snapshot`, and
`builder` (weights + tokenizer + KV pool + runner -> engine), `dp_router` (data-parallel
replicas), `ttft_estimator` and `drain_rate` (the estimates behind degradation and 429s).
"""
