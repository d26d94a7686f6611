"""Fit the simulator's memory-bound decode model on a measured GPU decode table (serving/tier/calibrations/h200-*/).

    python -m tailguard.serving.lab.gpu_calibration serving/tier/calibrations/h200-2026-12-04/decode.json

A decode step on a GPU streams the weights once and every running sequence's KV cache once, so its time is
`base + per_seq * batch + batch * context * kv_bytes_per_token / bandwidth` (Hardware's decode_step_base_s,
decode_per_seq_s, decode_kv_bandwidth_gbps). The table gives the step time for batches and contexts; the three
values are fitted by non-negative least squares on relative error (each row counts alike, short steps as much
as long ones), and printed as the `hardware:` block of serving/tier/calibrations/h200-llama-3-8b.yaml.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from tailguard.controller import InputError

# Llama-3-8B at 16 bits: 2 (K, V) * 32 layers * 8 KV heads * 128 * 2 B.
LLAMA_3_8B_KV_BYTES_PER_TOKEN = 131072


class DecodeTableError(InputError, ValueError):
    """The decode table file is missing, not JSON, or lacks a field."""


@dataclass(frozen=True)
class DecodeRow:
    batch: int
    context: int
    step_s: float


@dataclass(frozen=True)
class DecodeTable:
    gpu: str
    model: str
    weights_gib: float
    rows: tuple[DecodeRow, ...]
    prefill_tokens_per_s: tuple[tuple[int, float], ...]  # (prompt tokens, tokens/s) of one-sequence prefills


@dataclass(frozen=True)
class DecodeFit:
    decode_step_base_s: float
    decode_per_seq_s: float
    decode_kv_bandwidth_gbps: float
    max_relative_error: float


def load_decode_table(path: Path) -> DecodeTable:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = tuple(
            DecodeRow(int(row["batch"]), int(row["context"]), float(row["step_ms"]) / 1000.0) for row in data["decode"]
        )
        prefill = tuple((int(row["tokens"]), float(row["tokens_per_s"])) for row in data.get("prefill", []))
        return DecodeTable(str(data["gpu"]), str(data["model"]), float(data["weights_GiB"]), rows, prefill)
    except OSError as exc:
        raise DecodeTableError(f"{path}: cannot read the decode table: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise DecodeTableError(f"{path}: line {exc.lineno}: not JSON: {exc.msg}") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise DecodeTableError(
            f"{path}: expected gpu, model, weights_GiB and decode[] rows of batch, context, step_ms: {exc!r}"
        ) from exc


def fit_decode_table(table: DecodeTable, kv_bytes_per_token: int = LLAMA_3_8B_KV_BYTES_PER_TOKEN) -> DecodeFit:
    if len(table.rows) < 3:
        raise DecodeTableError(f"need at least 3 decode rows to fit 3 values, got {len(table.rows)}")
    batch = np.array([row.batch for row in table.rows], dtype=float)
    kv_bytes = batch * np.array([row.context for row in table.rows], dtype=float) * kv_bytes_per_token
    step = np.array([row.step_s for row in table.rows])
    features = np.stack([np.ones_like(batch), batch, kv_bytes], axis=1)
    coefficients, _ = nnls(features / step[:, None], np.ones_like(step))
    base, per_seq, seconds_per_byte = (float(value) for value in coefficients)
    if seconds_per_byte <= 0:
        raise DecodeTableError("the fit found no KV-dependent cost: the table needs more than one context")
    predicted = features @ coefficients
    return DecodeFit(base, per_seq, 1.0 / seconds_per_byte / 1e9, float(np.max(np.abs(predicted / step - 1.0))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", type=Path, help="decode.json of a GPU recording")
    parser.add_argument("--kv-bytes-per-token", type=int, default=LLAMA_3_8B_KV_BYTES_PER_TOKEN)
    args = parser.parse_args(argv)
    try:
        table = load_decode_table(args.table)
        fit = fit_decode_table(table, args.kv_bytes_per_token)
    except DecodeTableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"# {table.gpu}, {table.model}: {len(table.rows)} rows, worst error {fit.max_relative_error:.1%}")
    print("hardware:")
    print(f"  decode_step_base_s: {fit.decode_step_base_s:.7f}")
    print(f"  decode_per_seq_s: {fit.decode_per_seq_s:.8f}")
    print(f"  decode_kv_bandwidth_gbps: {fit.decode_kv_bandwidth_gbps:.0f}")
    for tokens, rate in table.prefill_tokens_per_s:
        print(f"  # prefill of {tokens} tokens: {rate:.0f} tokens/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
