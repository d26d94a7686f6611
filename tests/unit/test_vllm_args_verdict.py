"""validate_cli_args tells a refusal by vLLM's parser from no verdict at all (the parser could not run, timed
out, or printed none): the tier answers the first 422 and caches it, the second 503 and caches nothing."""

from __future__ import annotations

from pathlib import Path

from tailguard.serving.tier.vllm_args import validate_cli_args


def _fake_python(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    script.chmod(0o755)
    return script


def test_a_refusal_is_a_verdict(tmp_path: Path) -> None:
    refusing = _fake_python(tmp_path, """echo '{"ok": false, "argument": "--max-num-seqs", "error": "bad"}'""")
    result = validate_cli_args(refusing, ["--max-num-seqs", "0"])
    assert (result.ok, result.verdict, result.argument) == (False, True, "--max-num-seqs")


def test_a_parser_that_times_out_or_says_nothing_gives_no_verdict(tmp_path: Path) -> None:
    slow = _fake_python(tmp_path, "exec sleep 30")
    timed_out = validate_cli_args(slow, ["--max-num-seqs", "1"], timeout_s=0.5)
    assert (timed_out.ok, timed_out.verdict) == (False, False)
    assert "timed out" in timed_out.error

    silent = tmp_path / "silent"
    silent.mkdir()
    mute = _fake_python(silent, "echo 'Traceback: ImportError'; exit 1")
    crashed = validate_cli_args(mute, ["--max-num-seqs", "1"])
    assert (crashed.ok, crashed.verdict) == (False, False)
    assert "no verdict" in crashed.error


def test_an_accepted_profile_is_a_verdict(tmp_path: Path) -> None:
    accepting = _fake_python(tmp_path, """echo 'loading'; echo '{"ok": true}'""")
    result = validate_cli_args(accepting, ["--max-num-seqs", "64"])
    assert (result.ok, result.verdict) == (True, True)
