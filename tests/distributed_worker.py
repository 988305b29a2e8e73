"""One process of the two-process test in tests/test_distributed.py (run as a script).

Process 0 (leader) serves greedy requests through `LLM.generate` on a tiny random model
(``--load-format dummy``) tensor-parallel over the devices of both processes, writes the
tokens, logits and its KV-cache shard shapes to ``--out``, and shuts down; process 1
(follower) runs the broadcast steps until told to stop and writes its step count.
"""
from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--process-id", type=int, required=True)
    ap.add_argument("--num-processes", type=int, default=2)
    ap.add_argument("--config", required=True)
    ap.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--tensor-parallel-size", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from jaxinfer.distributed import multihost as distributed
    from jaxinfer.config import ParallelConfig

    multi = distributed.initialize(ParallelConfig(tensor_parallel_size=args.tensor_parallel_size,
                                                  coordinator_address=args.coordinator,
                                                  num_processes=args.num_processes, process_id=args.process_id))
    import jax

    from jaxinfer import LLM, SamplingParams

    llm = LLM(args.config, load_format="dummy", tensor_parallel_size=args.tensor_parallel_size, max_model_len=64,
              max_num_seqs=4, max_num_batched_tokens=32, num_blocks=32, warmup=False, return_logits=True,
              enable_prefix_caching=False)
    result = {"multi": multi, "process_count": jax.process_count(), "device_count": jax.device_count()}
    if distributed.is_leader():
        sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
        outs = llm.generate(json.loads(args.prompts), sp, use_tqdm=False)
        k = llm.engine.runner.k_cache
        result.update(tokens=[o.outputs[0].token_ids for o in outs],
                      logits=[[row.tolist() for row in o.outputs[0].logits] for o in outs],
                      kv_global_shape=list(k.shape), kv_shard_shapes=[list(s.data.shape) for s in k.addressable_shards],
                      steps=llm.engine.stats.num_steps)
    else:
        result["steps"] = distributed.serve_follower(llm.engine)
    distributed.shutdown(llm.engine)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
