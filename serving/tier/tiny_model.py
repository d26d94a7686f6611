"""A tiny Llama model generated offline, for serving real vLLM processes on CPU-only machines.

Nothing is downloaded: the weights are random (seeded) and the tokenizer is a byte-level BPE trained on local
text (the Python standard library's own sources). The model is what vLLM loads with `--model DIR`:
LlamaForCausalLM, hidden 128, 2 layers, 4 heads (head dim 32, which vLLM's CPU attention supports), safetensors.

Building needs torch, transformers and tokenizers, which live in the serving virtualenv only; so the build runs
there as a subprocess (`python -m tailguard.serving.tier.tiny_model DIR` under the serving interpreter), and
`ensure_tiny_model` is what the rest of the project calls: it rebuilds only when the cached model is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from tailguard.serving.errors import LabError

DEFAULT_MODEL_DIR = Path(".tailguard") / "models" / "tiny-llama"
SERVED_MODEL_NAME = "tiny-llama"
SEED = 1234
VOCAB_SIZE = 4096
# Files vLLM needs to load the model; the marker is written last, so a half-built directory is never trusted.
COMPLETE_MARKER = "tailguard-model.json"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MODEL_CONFIG = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "vocab_size": VOCAB_SIZE,
}


class TinyModelError(LabError, RuntimeError):
    """The tiny model could not be built (the message names the step and the serving interpreter)."""


def is_complete(model_dir: Path) -> bool:
    return (model_dir / COMPLETE_MARKER).is_file()


def ensure_tiny_model(serving_python: Path, model_dir: Path = DEFAULT_MODEL_DIR, timeout_s: float = 600.0) -> Path:
    """Return `model_dir`, building the model there with the serving virtualenv's interpreter when missing."""
    model_dir = model_dir.resolve()
    if is_complete(model_dir):
        return model_dir
    if not Path(serving_python).is_file():
        raise TinyModelError(f"serving interpreter {serving_python} not found; run `make serving-env` first")
    project_root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(project_root), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run(
        [str(serving_python), "-m", "tailguard.serving.tier.tiny_model", str(model_dir)],
        cwd=project_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if result.returncode != 0 or not is_complete(model_dir):
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise TinyModelError(f"building the tiny model in {model_dir} failed: " + " | ".join(tail))
    return model_dir


def _training_files(limit: int = 120) -> list[str]:
    """Python's own stdlib sources: plenty of local, license-clean text for a small BPE vocabulary."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(path) for path in stdlib.glob("*.py"))
    return files[:limit]


def build(model_dir: Path, seed: int = SEED) -> None:
    """Build the model into `model_dir` (runs inside the serving virtualenv: torch, transformers, tokenizers)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train(_training_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = MODEL_CONFIG["max_position_embeddings"]

    config = LlamaConfig(
        **MODEL_CONFIG,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="bfloat16",
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    # Build beside the target and rename, so a crash never leaves a directory that looks complete.
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=model_dir.parent))
    staging.chmod(0o755)
    try:
        model.save_pretrained(staging, safe_serialization=True)
        fast.save_pretrained(staging)
        (staging / COMPLETE_MARKER).write_text(json.dumps({"seed": seed, **MODEL_CONFIG}, indent=2) + "\n")
        if model_dir.exists():
            shutil.rmtree(model_dir)
        staging.rename(model_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the tiny offline Llama model (run with the serving venv).")
    parser.add_argument("model_dir", nargs="?", default=str(DEFAULT_MODEL_DIR))
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--force", action="store_true", help="rebuild even when the model exists")
    args = parser.parse_args(argv)
    model_dir = Path(args.model_dir).resolve()
    if is_complete(model_dir) and not args.force:
        print(f"tiny model already at {model_dir}")
        return 0
    try:
        build(model_dir, args.seed)
    except ImportError as exc:
        print(f"error: {exc}; build the tiny model with the serving virtualenv's python", file=sys.stderr)
        return 2
    print(f"tiny model written to {model_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
