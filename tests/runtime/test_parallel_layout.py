"""The pure arithmetic of tensor/pipeline parallelism: ranks, stage layers, checkpoint slices, the
LeaderWorkerSet environment, and the per-rank KV bytes the planner sizes with."""

from __future__ import annotations

import pytest
from kvpilot.contracts.kv_cache import kv_bytes_per_token
from kvpilot.runtime.distributed.sharding import (
    TensorSplit,
    kv_head_start,
    kv_split,
    vocab_split,
)
from kvpilot.runtime.distributed.topology import NodeLaunch, Rank, TopologyError, node_launch, stage_layers


def test_rank_coordinates() -> None:
    ranks = [Rank(r, tp=2, pp=3) for r in range(6)]
    assert [(r.tp_rank, r.pp_rank) for r in ranks] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert ranks[0].is_first_stage and ranks[5].is_last_stage and not ranks[3].is_last_stage
    assert ranks[3].stage_ranks(2) == [4, 5]


@pytest.mark.parametrize(("layers", "pp"), [(2, 2), (3, 2), (80, 3), (7, 7), (36, 5)])
def test_stages_cover_every_layer_once_busiest_first(layers: int, pp: int) -> None:
    stages = [stage_layers(layers, pp, s) for s in range(pp)]
    assert [i for st in stages for i in st] == list(range(layers))
    assert len(stages[0]) == -(-layers // pp) and all(len(st) >= 1 for st in stages)


def test_kv_heads_split_then_replicated() -> None:
    assert [kv_head_start(8, 4, r) for r in range(4)] == [0, 2, 4, 6]
    assert [kv_head_start(2, 4, r) for r in range(4)] == [0, 0, 1, 1]  # each head on two ranks
    assert [kv_head_start(1, 4, r) for r in range(4)] == [0, 0, 0, 0]
    assert kv_split(2, 16, 4, 3) == TensorSplit(0, 16, 16, whole=32)
    assert kv_split(8, 16, 1, 0) is None


def test_vocab_blocks_are_padded() -> None:
    splits = [vocab_split(1027, 4, r) for r in range(4)]
    assert [(s.start, s.length, s.padded_to) for s in splits if s] == [
        (0, 257, 257),
        (257, 257, 257),
        (514, 257, 257),
        (771, 256, 257),
    ]


def test_single_node_without_lws() -> None:
    assert node_launch({}, 4) == NodeLaunch("127.0.0.1", 29500, 0, 4, 1)


def test_lws_worker_pod_runs_its_stage_ranks() -> None:
    env = {"LWS_LEADER_ADDRESS": "llama-0.llama", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}
    launch = node_launch({**env, "KVPILOT_DIST_PORT": "29600"}, 8)
    assert launch == NodeLaunch("llama-0.llama", 29600, 4, 4, 2) and not launch.is_leader
    assert node_launch({**env, "LWS_WORKER_INDEX": "0"}, 8).is_leader


@pytest.mark.parametrize(
    ("env", "world", "message"),
    [
        ({"LWS_GROUP_SIZE": "3", "LWS_LEADER_ADDRESS": "x"}, 8, "8 ranks cannot be spread evenly over"),
        ({"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "2", "LWS_LEADER_ADDRESS": "x"}, 4, "is not within"),
        ({"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}, 4, "LWS_LEADER_ADDRESS is not set"),
        ({"KVPILOT_DIST_PORT": "http"}, 2, "is not a port number"),
    ],
)
def test_bad_lws_environment_is_named(env: dict[str, str], world: int, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        node_launch(env, world)


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (1, 3)])
def test_runner_kv_bytes_are_the_planners_per_gpu_bytes(tp: int, pp: int) -> None:
    """The busiest rank (stage 0, any tensor-parallel rank) allocates what the planner sizes per GPU."""
    import torch
    from kvpilot.runtime.config import ModelConfig
    from kvpilot.runtime.engine.model_runner import kv_block_bytes

    raw = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
    }
    config = ModelConfig.from_dict(raw)
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float8_e4m3fn, "fp8")):
        runtime = kv_block_bytes(config, 16, dtype, Rank(0, tp, pp)) // 16
        planned = kv_bytes_per_token(
            num_layers=80,
            num_kv_heads=4,
            head_dim=128,
            kv_dtype=name,
            tensor_parallel=tp,
            pipeline_parallel=pp,
        )
        assert runtime == planned


def test_int4_group_notes_name_layers_whose_group_changes() -> None:
    from kvpilot.runtime.distributed.quant_sharding import int4_group_notes

    notes = int4_group_notes({"o_proj": 576, "down_proj": 1536}, 2)
    assert notes == [
        "int4 at load: o_proj (576 inputs, 288 per tensor-parallel rank) is quantized in groups of 32 per "
        "rank, one GPU would use 64"
    ]
    assert int4_group_notes({"o_proj": 4096, "down_proj": 12288}, 2) == []


def test_quantized_tensors_split_on_their_packing_axis() -> None:
    from kvpilot.runtime.distributed.quant_sharding import quantized_split
    from kvpilot.runtime.errors import ModelLoadError
    from kvpilot.runtime.quant.config import QuantConfig

    gptq = QuantConfig("gptq", True, bits=4, group_size=32)
    awq = QuantConfig("awq", True, bits=4, group_size=32, sym=False)
    outputs = TensorSplit(0, 64, 64, whole=128)  # column parallel: N [64, 128) of 128
    inputs = TensorSplit(1, 64, 64, whole=128)  # row parallel: K [64, 128) of 128
    assert quantized_split(gptq, "qweight", (16, 128), outputs) == TensorSplit(1, 64, 64, whole=128)
    assert quantized_split(gptq, "qweight", (16, 128), inputs) == TensorSplit(0, 8, 8, whole=16)
    assert quantized_split(gptq, "qzeros", (4, 16), outputs) == TensorSplit(1, 8, 8, whole=16)
    assert quantized_split(gptq, "scales", (4, 128), inputs) == TensorSplit(0, 2, 2, whole=4)
    assert quantized_split(gptq, "g_idx", (128,), outputs) is None  # every output column's rows
    assert quantized_split(awq, "qweight", (128, 16), outputs) == TensorSplit(1, 8, 8, whole=16)
    assert quantized_split(awq, "qweight", (128, 16), inputs) == TensorSplit(0, 64, 64, whole=128)
    one_group = QuantConfig("gptq", True, bits=8, group_size=-1)
    assert quantized_split(one_group, "scales", (1, 128), inputs) is None  # the one group: every rank's
    fp8 = QuantConfig("fp8", True, bits=8)
    assert quantized_split(fp8, "weight", (128, 128), inputs) == TensorSplit(1, 64, 64, whole=128)
    assert quantized_split(fp8, "weight_scale", (128, 1), outputs) == TensorSplit(0, 64, 64, whole=128)
    assert quantized_split(fp8, "weight_scale", (), outputs) is None  # per tensor
    with pytest.raises(ModelLoadError, match=r"words of 8, and tensor parallel 4 gives this rank output "):
        quantized_split(awq, "qweight", (128, 6), TensorSplit(0, 12, 12, whole=48))
