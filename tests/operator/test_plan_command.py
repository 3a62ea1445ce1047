"""`kvpilot plan` prints the plan as a table or as status.plan JSON; the Hub is a fake here."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from kvpilot.operator.hub_config import ConfigFetchError
from kvpilot.operator.planning.command import run

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


@pytest.fixture()
def fake_hub(model_configs: dict[str, dict[str, Any]]) -> Any:
    async def fetch(repo: str, revision: str) -> dict[str, Any]:
        if repo not in model_configs:
            raise ConfigFetchError(f"could not read https://huggingface.co/{repo}: HTTP 404")
        return model_configs[repo]

    return fetch


def plan_command(argv: list[str], fetch: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return run(argv, fetch=fetch, out=out, err=err), out.getvalue(), err.getvalue()


# What this runtime build can't run yet: the plan that would fit needs these (examples' comments say so).
NOT_RUNNABLE_YET: dict[str, str] = {}  # example -> the start of its UnsupportedByRuntime reason


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_example_plans_or_says_what_the_runtime_lacks(example: str, fake_hub: Any) -> None:
    rc, out, _ = plan_command(["-f", str(EXAMPLES / example), "-o", "json"], fake_hub)
    plan = json.loads(out)
    if example not in NOT_RUNNABLE_YET:
        assert rc == 0 and plan["feasible"] is True, plan["reason"]
    else:
        assert rc == 1 and plan["feasible"] is False
        assert plan["reason"].startswith(NOT_RUNNABLE_YET[example])
        assert "the plan that would fit:" in plan["reason"]
        assert "UnsupportedByRuntime" in (EXAMPLES / example).read_text()


def test_quantized_tensor_parallel_example_plans(fake_hub: Any) -> None:
    """The 72B AWQ checkpoint split over two RTX 4090s (quantized weights run tensor-parallel)."""
    rc, out, _ = plan_command(["-f", str(EXAMPLES / "qwen2.5-72b-2x4090.yaml")], fake_hub)
    assert rc == 0
    assert "2 x rtx4090 (tp2), 4-bit AWQ weights, int8 KV" in out


def test_tensor_parallel_example_plans(fake_hub: Any) -> None:
    rc, out, _ = plan_command(["-f", str(EXAMPLES / "llama-70b-4xh100.yaml")], fake_hub)
    assert rc == 0
    assert "4 x h100-80gb (tp4), 16-bit (bf16) weights, bf16 KV: 64 sequences" in out


def test_json_uses_status_plan_field_names(fake_hub: Any, isvc_schema: dict[str, Any]) -> None:
    rc, out, _ = plan_command(["-f", str(EXAMPLES / "qwen3-8b-h100.yaml"), "-o", "json"], fake_hub)
    plan = json.loads(out)
    status_plan = isvc_schema["properties"]["status"]["properties"]["plan"]["properties"]
    assert rc == 0 and set(plan) == set(status_plan)
    assert (plan["tensorParallel"], plan["quantization"], plan["gpus"]) == (1, "none", 1)


def test_table_for_people(fake_hub: Any) -> None:
    rc, out, _ = plan_command(["-f", str(EXAMPLES / "qwen3-8b-h100.yaml")], fake_hub)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == "qwen3-8b: hf://Qwen/Qwen3-8B"
    assert lines[1].startswith("  1 x h100-80gb (tp1), 16-bit (bf16) weights, int8 KV: 64 sequences")
    assert lines[2].split() == ["FIELD", "VALUE", "WHY"]
    row = next(line for line in lines if line.split()[:1] == ["kvCacheDtype"])
    assert row.split()[1] == "int8" and "at most 57 of 64" in row  # int4 weights + 16-bit KV: 57


def test_gpu_override_and_infeasible_exit_status(tmp_path: Path, fake_hub: Any) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text((EXAMPLES / "llama-70b-4xh100.yaml").read_text().replace("count: 4", "count: 1"))
    rc, out, _ = plan_command(["-f", str(manifest), "--gpu", "l4"], fake_hub)
    assert rc == 1
    assert "NOT PLANNED (Infeasible): does not fit" in out and "1 x l4 offer" in out
    assert "spec.gpu.count: 4 would fit" in out


def test_several_documents_and_other_kinds(tmp_path: Path, fake_hub: Any) -> None:
    docs = [
        (EXAMPLES / "small-model-l4.yaml").read_text(),
        "apiVersion: v1\nkind: ConfigMap\n",
        (EXAMPLES / "scale-to-zero.yaml").read_text(),
    ]
    manifest = tmp_path / "all.yaml"
    manifest.write_text("\n---\n".join(docs))
    rc, out, _ = plan_command(["-f", str(manifest), "-o", "json"], fake_hub)
    plans = json.loads(out)
    assert rc == 0 and [p["gpuProfile"] for p in plans] == ["l4", "l40s"]


def test_unreadable_model_config_says_what_to_add(tmp_path: Path, fake_hub: Any) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text((EXAMPLES / "small-model-l4.yaml").read_text().replace("Qwen3-0.6B", "Nope-1B"))
    rc, out, _ = plan_command(["-f", str(manifest), "-o", "json"], fake_hub)
    plan = json.loads(out)
    assert rc == 1 and plan["feasible"] is False
    assert plan["reason"].startswith(
        "ModelConfigUnavailable: could not read https://huggingface.co/Qwen/Nope"
    )
    assert "add spec.model.config" in plan["reason"]


def test_offline_never_fetches(fake_hub: Any) -> None:
    rc, out, _ = plan_command(["-f", str(EXAMPLES / "small-model-l4.yaml"), "--offline"], None)
    assert rc == 1 and "ModelConfigUnavailable" in out


def test_invalid_spec_and_unknown_profile(tmp_path: Path, fake_hub: Any) -> None:
    manifest = tmp_path / "m.yaml"
    text = (EXAMPLES / "scale-to-zero.yaml").read_text()
    manifest.write_text(text.replace("profile: l40s", "profile: tpu-v5"))
    rc, out, _ = plan_command(["-f", str(manifest)], fake_hub)
    assert rc == 1
    assert "NOT PLANNED (UnknownGPUProfile): unknown GPU profile 'tpu-v5'; known: a100-40gb" in out
    manifest.write_text(text.replace("replicas: 0", "replicas: -3"))
    rc, out, _ = plan_command(["-f", str(manifest)], fake_hub)
    assert rc == 1 and "NOT PLANNED (InvalidSpec): spec.replicas" in out


def test_admin_profiles_file(tmp_path: Path, fake_hub: Any) -> None:
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("- {name: lab-a6000, memoryGiB: 48, bandwidthGBps: 768, bf16Tflops: 155}\n")
    rc, out, _ = plan_command(
        [
            "-f",
            str(EXAMPLES / "qwen3-8b-h100.yaml"),
            "--gpu",
            "lab-a6000",
            "--profiles",
            str(profiles),
            "-o",
            "json",
        ],
        fake_hub,
    )
    assert rc == 0 and json.loads(out)["gpuProfile"] == "lab-a6000"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("apiVersion: v1\nkind: ConfigMap\n", "no InferenceService documents"),
        ("a: [", "while parsing"),
    ],
)
def test_usage_errors(tmp_path: Path, content: str, message: str) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(content)
    rc, _, err = plan_command(["-f", str(manifest)], None)
    assert rc == 2 and message in err


def test_missing_file() -> None:
    rc, _, err = plan_command(["-f", "/nonexistent/kvis.yaml"], None)
    assert rc == 2 and "No such file" in err


def test_cli_entry_does_not_import_cluster_or_torch_modules() -> None:
    import subprocess

    code = (
        "import sys, kvpilot.operator.planning.command; "
        "print(sorted(m for m in ('kopf', 'kubernetes', 'torch') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_block_fp8_example_plans_its_own_format(fake_hub: Any) -> None:
    """Qwen3-8B as Qwen ships it in fp8 (128 x 128 blocks): the plan runs the checkpoint's own format."""
    rc, out, _ = plan_command(["-f", str(EXAMPLES / "qwen3-8b-fp8-l4.yaml")], fake_hub)
    assert rc == 0
    assert "1 x l4 (tp1), fp8 weights" in out
    assert "the checkpoint is fp8-quantized (block-wise [128, 128], config.json quantization_config)" in out
