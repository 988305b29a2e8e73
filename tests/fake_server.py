"""``python tests/fake_server.py PORT [GRACE_S [REPLICAS]]``: `server.serve` over a fake-runner engine, or over
a `jaxinfer.engine.dp_router.DataParallelRouter` of REPLICAS of them (SIGTERM drain tests).

Not a test module: a subprocess target, so signals reach a real uvicorn main thread.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import server  # noqa: E402
from api_helpers import fake_engine, server_config  # noqa: E402
from jaxinfer.entrypoints.openai.app import create_app  # noqa: E402
from jaxinfer.engine.async_engine import AsyncEngine  # noqa: E402
from jaxinfer.engine.dp_router import DataParallelRouter  # noqa: E402


def main() -> None:
    logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")  # the drain's lines
    port = int(sys.argv[1])
    grace = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    replicas = int(sys.argv[3]) if len(sys.argv) > 3 else 1

    def build():
        engines = [fake_engine(max_model_len=2048, num_blocks=257, step_delay=0.01) for _ in range(replicas)]
        return engines[0] if replicas == 1 else DataParallelRouter(engines)

    async_engine = AsyncEngine(build)
    config = server_config(port=port, shutdown_timeout=grace)
    server.serve(create_app(async_engine, config), async_engine, config)


if __name__ == "__main__":
    main()
