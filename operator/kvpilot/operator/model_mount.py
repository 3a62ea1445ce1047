"""How the model's files reach the runtime container, per URI scheme.

- hf://org/repo   an init container downloads the snapshot with huggingface_hub into a cache volume
- pvc://claim/dir the claim is mounted read-only; the model is the directory inside it
- s3://bucket/dir an init container syncs the prefix with the AWS CLI into a cache volume
Credentials (HF_TOKEN, AWS_*) come from spec.runtime.env, which the init containers also get.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvpilot.operator.spec import ModelSource

MODELS_DIR = "/models"
VOLUME = "model"
S3_IMAGE = "amazon/aws-cli:2.22.35"
HF_PATTERNS = "*.json,*.safetensors,*.model,*.tiktoken,*.txt,*.jinja"
HF_DOWNLOAD = (
    "import os\n"
    "from huggingface_hub import snapshot_download\n"
    "snapshot_download(repo_id=os.environ['HF_REPO'], revision=os.environ['HF_REVISION'],\n"
    "                  local_dir=os.environ['MODEL_DIR'],\n"
    "                  allow_patterns=os.environ['HF_PATTERNS'].split(','))\n"
)


@dataclass(frozen=True)
class ModelMount:
    model_dir: str
    volumes: list[dict[str, Any]]
    mount: dict[str, Any]
    init_containers: list[dict[str, Any]] = field(default_factory=list)


def model_mount(
    source: ModelSource,
    runtime_image: str,
    env: list[dict[str, Any]],
    weight_bytes: int,
    *,
    volume_name: str = VOLUME,
    root: str = MODELS_DIR,
) -> ModelMount:
    """The main model under /models (volume "model"); a draft model passes its own volume name and root."""
    if source.scheme == "pvc":
        claim, _, path = source.location.partition("/")
        volume = {"name": volume_name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        return ModelMount(
            f"{root}/{path}".rstrip("/"),
            [volume],
            {"name": volume_name, "mountPath": root, "readOnly": True},
        )
    model_dir = f"{root}/model"
    size_gib = max(1, math.ceil(weight_bytes * 1.2 / 1024**3))
    volume = {"name": volume_name, "emptyDir": {"sizeLimit": f"{size_gib}Gi"}}
    writable = {"name": volume_name, "mountPath": root}
    if source.scheme == "hf":
        fetch = {
            "name": f"fetch-{volume_name}",
            "image": runtime_image,
            "command": ["python", "-c", HF_DOWNLOAD],
            "env": [
                _env("HF_REPO", source.location),
                _env("HF_REVISION", source.revision),
                _env("MODEL_DIR", model_dir),
                _env("HF_PATTERNS", HF_PATTERNS),
                _env("HF_HOME", f"{root}/.hf"),
                *env,
            ],
        }
    else:
        command = ["aws", "s3", "sync", source.uri, model_dir, "--only-show-errors"]
        fetch = {"name": f"fetch-{volume_name}", "image": S3_IMAGE, "command": command, "env": list(env)}
    fetch["volumeMounts"] = [writable]
    return ModelMount(model_dir, [volume], {**writable, "readOnly": True}, [fetch])


def _env(name: str, value: str) -> dict[str, str]:
    return {"name": name, "value": value}
