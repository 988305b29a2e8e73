"""compare.py's second jaxinfer system: this checkout's server.py with --dtype bfloat16."""
import runpy, sys
sys.argv = ["/work/main/server.py"] + sys.argv[1:] + ["--dtype", "bfloat16"]
runpy.run_path("/work/main/server.py", run_name="__main__")
