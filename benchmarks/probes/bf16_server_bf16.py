"""compare.py's second jaxinfer system in the served run: this checkout's server.py with
--dtype bfloat16 appended (compare.py --before-jaxinfer-args does this now)."""
import runpy
import sys
from pathlib import Path

server = str(Path(__file__).resolve().parents[2] / "server.py")
sys.argv = [server] + sys.argv[1:] + ["--dtype", "bfloat16"]
runpy.run_path(server, run_name="__main__")
