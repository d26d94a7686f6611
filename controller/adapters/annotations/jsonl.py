"""Annotations: a local JSONL log (always), and a fan-out to more annotators (Grafana, when configured)."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tailguard.controller.core.ports import ActionOutcome, Annotation, Annotator, OutcomeStatus

log = logging.getLogger(__name__)


def annotation_json(annotation: Annotation, idempotency_key: str) -> dict[str, Any]:
    return {
        "idempotency_key": idempotency_key,
        "time": annotation.time,
        "time_end": annotation.time_end,
        "text": annotation.text,
        "tags": list(annotation.tags),
        "decision_id": annotation.decision_id,
        "labels": dict(annotation.labels),
    }


class JsonlAnnotator:
    """Appends one JSON object per line and fsyncs it; a key already in the file is not written again."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._keys: set[str] = set()
        self._load_keys()

    def _load_keys(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("r", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except ValueError:
                    # A crash mid-append leaves a torn last line: that annotation is written again.
                    log.warning("%s:%d: not a JSON object, ignored", self.path, number)
                    continue
                if isinstance(entry, dict) and isinstance(entry.get("idempotency_key"), str):
                    self._keys.add(entry["idempotency_key"])

    def keys(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._keys)

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out: list[dict[str, Any]] = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                out.append(entry)
        return out

    def annotate(self, annotation: Annotation, *, idempotency_key: str) -> ActionOutcome:
        with self._lock:
            if idempotency_key in self._keys:
                return ActionOutcome(OutcomeStatus.SUCCEEDED, {"path": str(self.path), "deduplicated": True})
            line = json.dumps(annotation_json(annotation, idempotency_key), sort_keys=True, default=str)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a+b") as handle:
                    prefix = b""
                    if handle.tell() > 0:
                        handle.seek(-1, os.SEEK_END)
                        if handle.read(1) != b"\n":
                            prefix = b"\n"  # end a torn line first, so this entry stays parseable
                    handle.write(prefix + line.encode("utf-8") + b"\n")
                    handle.flush()
                    os.fsync(handle.fileno())
            except OSError as exc:
                return ActionOutcome(
                    OutcomeStatus.FAILED,
                    {"path": str(self.path)},
                    f"annotation log {self.path}: {exc.strerror or exc}",
                    False,
                )
            self._keys.add(idempotency_key)
        return ActionOutcome(OutcomeStatus.SUCCEEDED, {"path": str(self.path), "deduplicated": False})


class FanoutAnnotator:
    """Sends each annotation to every annotator; succeeds only if all do (each deduplicates by key)."""

    def __init__(self, annotators: Sequence[Annotator]) -> None:
        self.annotators = list(annotators)

    def annotate(self, annotation: Annotation, *, idempotency_key: str) -> ActionOutcome:
        details: list[dict[str, Any]] = []
        errors: list[str] = []
        transient = False
        for annotator in self.annotators:
            name = type(annotator).__name__
            try:
                outcome = annotator.annotate(annotation, idempotency_key=idempotency_key)
            except Exception as exc:  # noqa: BLE001 - one broken annotator must not hide the others' results
                outcome = ActionOutcome(OutcomeStatus.FAILED, {}, f"{type(exc).__name__}: {exc}", False)
            details.append({"annotator": name, **outcome.to_json()})
            if outcome.status is OutcomeStatus.FAILED:
                errors.append(f"{name}: {outcome.error}")
                transient = transient or outcome.transient
        if errors:
            return ActionOutcome(OutcomeStatus.FAILED, {"annotators": details}, "; ".join(errors), transient)
        return ActionOutcome(OutcomeStatus.SUCCEEDED, {"annotators": details})
