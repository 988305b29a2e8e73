"""onestreampacked_one.py with the unrolled one-token bucket also given the AMX-packed weights (every layers_i
scope sees the whole packed stack): run with JAXINFER_UNROLL_MAX_TOKENS=1."""
import jaxinfer.kernels.cpu.amx as a
from jaxinfer.runner import model_runner as mr
from jaxinfer.models.llama import layer_name
orig = mr.ModelRunner._step_params
def patched(self, bucket):
    if self._unrolled(bucket) and self.amx:
        amx = {k: v for k, v in self.amx.items() if k != "layers"}
        for i in range(self.cfg.num_hidden_layers):
            amx[layer_name(i)] = self.amx["layers"]
        return {"params": self.layer_params, a.COLLECTION: amx}
    return orig(self, bucket)
mr.ModelRunner._step_params = patched
exec(open(__file__.rsplit('/', 1)[0] + '/onestreampacked_one.py').read())
