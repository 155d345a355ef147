"""One measurement in a fresh process, printed as a JSON line: the seconds to build a seeded
``size=1.6b`` model on the CPU (``build``), or to draw one ``normal_`` pass over as many values
in the same dtype (``normal``). Works with the code of either side of run.sh (before the meta-device
build, ``mcsd.build_model`` took no dtype: the model was built in fp32 and cast)."""

import inspect
import json
import sys
import time

import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import mcsd

what, arch, dtype_name = sys.argv[1:4]
dtype = getattr(torch, dtype_name)
torch.set_num_threads(2)
with initialize_config_module("mcsd.conf", version_base=None):
    node = OmegaConf.to_container(compose("build", overrides=[f"model={arch}", "size=1.6b"]).model, resolve=True)
params = mcsd.count_parameters(node)
torch.manual_seed(0)
start = time.perf_counter()
if what == "build":
    if "dtype" in inspect.signature(mcsd.build_model).parameters:
        model = mcsd.build_model(node, dtype=dtype)
    else:
        model = mcsd.build_model(node).to(dtype)
    assert {parameter.dtype for parameter in model.parameters()} == {dtype}
else:
    torch.empty(params, dtype=dtype).normal_(std=0.02)
seconds = time.perf_counter() - start
print(json.dumps({"what": what, "arch": arch, "dtype": dtype_name, "params": params, "seconds": seconds}))
