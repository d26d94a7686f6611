"""The SLA model inside the controller: prediction signals answered from one batched feature fetch.

A policy signal `predict: {model, dimension}` is the probability that the SLA of
`dimension` breaches within the model's horizon, per target. For one evaluation
the provider sends ONE instant query per feature (grouped by the policy's target
labels, through the same MetricsSource as the query signals), builds the feature
matrix once and answers every prediction signal of the policy from it.

Safety (what the issue asks and why):
- Models come from the controller configuration (`predictors:`), never from a
  policy. Loading goes through tailguard.predictors.artifact.load_artifact (skops with the
  artifact's allow-list); types outside it are refused unless `trustedTypes` names
  them or `allowUntrusted` is set, so a model file cannot run arbitrary code.
- A missing, stale (older than `maxAge`) or incompatible model (feature hash
  mismatch, other sklearn major version, untrusted types, corrupt files) makes its
  signals NO-DATA: values {}, never an error counted as a breach, never an action,
  never a crash. The model's state is logged once per change (not per evaluation)
  and listed by `warnings()` for /readyz.
- The files on disk are the truth: they are re-checked (size and mtime of every
  file) at each evaluation and reloaded when they change. A replaced artifact that
  does not load is not papered over with the previous one (which is no longer what
  the operator deployed); removing the artifact turns its signals into no-data.
- A target missing too many features (NaN) gets no prediction rather than a guess.
- Feature queries that fail are source errors (the same as a failing query signal):
  when more features failed than a target may miss, the prediction signals carry the
  error (errors are never breaches; the engine reports `errored` after maxSourceErrors).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tailguard.controller.core.model import SignalResult, TargetKey
from tailguard.controller.core.policy import Duration, Policy
from tailguard.controller.core.ports import Clock, MetricsSource
from tailguard.predictors.features import feature_hash, feature_matrix, feature_queries

logger = logging.getLogger("tailguard.predictors")

DEFAULT_MAX_AGE = 30 * 86400.0
# Several features exist only where their exporter does (DCGM HBM/DRAM, router jitter): half may be absent.
DEFAULT_MAX_MISSING_FRACTION = 0.5

NO_DATA = SignalResult(values={})
_T = TypeVar("_T")

# (directory) -> artifact; keyword arguments trusted_types and allow_untrusted
# (tailguard.predictors.artifact.load_artifact).
ArtifactLoader = Callable[..., Any]
# (artifact, X) -> {dimension: probabilities} (tailguard.predictors.artifact.predict_proba).
ProbabilityFunction = Callable[[Any, Any], Mapping[str, Any]]


class PredictorSettings(BaseModel):
    """One trained SLA model named in the controller configuration (`predictors: {name: ...}`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1, description="artifact directory, relative to the configuration file")
    trustedTypes: list[str] = Field(
        default_factory=list,
        description="fully qualified types trusted on top of the artifact's allow-list (skops)",
    )
    allowUntrusted: bool = Field(
        default=False, description="load types outside every allow-list (runs their code: only for own artifacts)"
    )
    maxAge: Duration = Field(
        default=DEFAULT_MAX_AGE, description="a model trained longer ago than this is stale (its signals no-data)"
    )
    maxMissingFeatures: float = Field(
        default=DEFAULT_MAX_MISSING_FRACTION,
        ge=0.0,
        le=1.0,
        description="a target missing more than this fraction of the features gets no prediction (no-data)",
    )


@dataclass(frozen=True)
class ModelSpec:
    """A configured model with its directory resolved."""

    name: str
    directory: Path
    trusted_types: tuple[str, ...] = ()
    allow_untrusted: bool = False
    max_age: float = DEFAULT_MAX_AGE
    max_missing_fraction: float = DEFAULT_MAX_MISSING_FRACTION


def model_specs(predictors: Mapping[str, PredictorSettings], resolve: Callable[[str], Path]) -> dict[str, ModelSpec]:
    """The configuration section as specs; `resolve` makes relative paths relative to the configuration file."""
    return {
        name: ModelSpec(
            name=name,
            directory=resolve(settings.path),
            trusted_types=tuple(settings.trustedTypes),
            allow_untrusted=settings.allowUntrusted,
            max_age=settings.maxAge,
            max_missing_fraction=settings.maxMissingFeatures,
        )
        for name, settings in predictors.items()
    }


class ModelStatus(StrEnum):
    READY = "ready"
    UNCONFIGURED = "unconfigured"  # a policy names a model the configuration does not have
    MISSING = "missing"  # no artifact at the configured path
    STALE = "stale"  # trained longer ago than maxAge
    INCOMPATIBLE = "incompatible"  # refused by the loader, or fails to predict


@dataclass(frozen=True)
class ModelState:
    name: str
    status: ModelStatus
    reason: str = ""
    directory: str = ""
    # Which files were loaded (a short hash of their sizes and mtimes): a reload of new files is a change.
    version: str = ""

    @property
    def usable(self) -> bool:
        return self.status is ModelStatus.READY

    def describe(self) -> str:
        if self.usable:
            return f"model {self.name}: ready ({self.directory}, files {self.version})"
        return f"model {self.name}: {self.status.value}: {self.reason}; its prediction signals are no-data"


Fingerprint = tuple[tuple[str, int, int], ...]


def directory_fingerprint(directory: Path) -> Fingerprint | None:
    """(relative path, size, mtime_ns) of every file under `directory`; None when there is no such directory."""
    if not directory.is_dir():
        return None
    entries: list[tuple[str, int, int]] = []
    for root, _dirs, files in os.walk(directory):
        for file_name in files:
            path = Path(root) / file_name
            try:
                stat = path.stat()
            except OSError:
                continue  # removed while we looked: the next check sees the new set
            entries.append((str(path.relative_to(directory)), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(entries))


def created_timestamp(created_at: Any) -> float | None:
    """Unix time of an artifact's `created_at` (a number, a datetime or an ISO 8601 string); None if unreadable."""
    if isinstance(created_at, bool):
        return None
    if isinstance(created_at, int | float):
        return float(created_at) if math.isfinite(created_at) else None
    if isinstance(created_at, datetime):
        return created_at.timestamp() if created_at.tzinfo is not None else None
    if isinstance(created_at, str):
        try:
            parsed = datetime.fromisoformat(created_at)
        except ValueError:
            return None
        return parsed.timestamp() if parsed.tzinfo is not None else None
    return None


@dataclass
class _Loaded:
    spec: ModelSpec
    fingerprint: Fingerprint | None
    artifact: Any | None  # the ModelArtifact when the files loaded and passed the checks
    refusal: ModelState | None  # why the files at `fingerprint` cannot be used (missing, incompatible)


def _default_loader() -> ArtifactLoader:
    # Imported late: scikit-learn and skops are only needed once a model is configured.
    from tailguard.predictors.artifact import load_artifact

    return load_artifact


def _default_probabilities() -> ProbabilityFunction:
    from tailguard.predictors.artifact import (
        predict_proba,  # the ml extra (scikit-learn, skops): only once a model is used
    )

    return predict_proba


def _current_feature_hash(names: Sequence[str] | None = None) -> str:
    """This version's hash over the artifact's own features (all of them when it names none)."""
    try:
        return str(feature_hash(list(names) if names is not None else None))
    except KeyError as unknown:
        return f"unknown feature {unknown}"


class PredictionProvider:
    """Answers a policy's prediction signals; thread-safe (evaluations of different policies run in parallel)."""

    def __init__(
        self,
        specs: Mapping[str, ModelSpec],
        clock: Clock,
        *,
        loader: ArtifactLoader | None = None,
        probabilities: ProbabilityFunction | None = None,
    ) -> None:
        self._specs = dict(specs)
        self._clock = clock
        self._loader = loader
        self._probabilities = probabilities
        self._lock = threading.Lock()
        self._loaded: dict[str, _Loaded] = {}
        self._states: dict[str, ModelState] = {}
        self._dimension_gaps: set[tuple[str, str]] = set()
        self._failures: dict[str, str] = {}

    # ----- model states ----------------------------------------------------------------------------

    def refresh(self, names: Sequence[str] | None = None) -> dict[str, ModelState]:
        """Check the models' files (reload what changed) and their age; the state of each model asked for."""
        wanted = sorted(self._specs) if names is None else list(dict.fromkeys(names))
        with self._lock:
            return {name: self._refresh_holding_lock(name) for name in wanted}

    def states(self) -> dict[str, ModelState]:
        """The last known state of every model configured or referenced (without touching the files)."""
        with self._lock:
            return dict(self._states)

    def warnings(self) -> list[str]:
        """One line per model that cannot be used (for /readyz): configured ones are checked now."""
        self.refresh()
        with self._lock:
            lines = [state.describe() for _name, state in sorted(self._states.items()) if not state.usable]
            lines.extend(
                f"model {model}: {reason}; its prediction signals are no-data"
                for model, reason in sorted(self._failures.items())
            )
            lines.extend(
                f"model {model}: has no {dimension} model; those prediction signals are no-data"
                for model, dimension in sorted(self._dimension_gaps)
            )
        return lines

    def _set_state(self, state: ModelState) -> ModelState:
        previous = self._states.get(state.name)
        if previous != state:
            # Logged once per change, so a broken model does not write a line every evaluation.
            if state.usable:
                logger.info("prediction %s", state.describe())
            else:
                logger.warning("prediction %s", state.describe())
        self._states[state.name] = state
        return state

    def _refresh_holding_lock(self, name: str) -> ModelState:
        spec = self._specs.get(name)
        if spec is None:
            configured = ", ".join(sorted(self._specs)) or "none"
            return self._set_state(
                ModelState(name, ModelStatus.UNCONFIGURED, f"not in the configuration's predictors ({configured})")
            )
        fingerprint = directory_fingerprint(spec.directory)
        loaded = self._loaded.get(name)
        if loaded is None or loaded.fingerprint != fingerprint:
            loaded = self._loaded[name] = self._load(spec, fingerprint)
        if loaded.refusal is not None:
            return self._set_state(loaded.refusal)
        created = created_timestamp(getattr(loaded.artifact, "created_at", None))
        if created is None:
            return self._set_state(
                ModelState(name, ModelStatus.STALE, "the artifact has no readable created_at", str(spec.directory))
            )
        age = self._clock.now() - created
        if age > spec.max_age:
            return self._set_state(
                ModelState(
                    name,
                    ModelStatus.STALE,
                    f"trained {age / 86400:.1f} days ago, older than maxAge {spec.max_age / 86400:.1f} days",
                    str(spec.directory),
                )
            )
        version = hashlib.sha256(repr(loaded.fingerprint).encode()).hexdigest()[:12]
        return self._set_state(ModelState(name, ModelStatus.READY, "", str(spec.directory), version))

    def _load(self, spec: ModelSpec, fingerprint: Fingerprint | None) -> _Loaded:
        directory = str(spec.directory)
        if fingerprint is None or not fingerprint:
            refusal = ModelState(spec.name, ModelStatus.MISSING, f"no model artifact at {directory}", directory)
            return _Loaded(spec, fingerprint, None, refusal)
        loader = self._loader or _default_loader()
        try:
            artifact = loader(spec.directory, trusted_types=spec.trusted_types, allow_untrusted=spec.allow_untrusted)
            expected_hash = _current_feature_hash(getattr(artifact, "feature_names", None))
        except Exception as refused:  # noqa: BLE001 - ArtifactError and anything a corrupt file raises: refuse it
            reason = str(refused) or str(getattr(refused, "reason", "")) or type(refused).__name__
            status = ModelStatus.MISSING if _says_missing(refused) else ModelStatus.INCOMPATIBLE
            return _Loaded(spec, fingerprint, None, ModelState(spec.name, status, reason, directory))
        # load_artifact checks the hash too; checked again here because serving must never trust a
        # matrix whose columns mean something else than what the model was trained on.
        artifact_hash = str(getattr(artifact, "feature_hash", ""))
        if artifact_hash != expected_hash:
            reason = f"feature hash mismatch: artifact {artifact_hash[:12]}, controller {expected_hash[:12]}"
            return _Loaded(spec, fingerprint, None, ModelState(spec.name, ModelStatus.INCOMPATIBLE, reason, directory))
        return _Loaded(spec, fingerprint, artifact, None)

    # ----- predictions -----------------------------------------------------------------------------

    def predict(self, source: MetricsSource, policy: Policy, at: float | None = None) -> dict[str, SignalResult]:
        """Every prediction signal of `policy`: probabilities per target, no-data, or the feature source's error."""
        signals = [signal for signal in policy.signals if signal.predict is not None]
        if not signals:
            return {}
        results: dict[str, SignalResult] = {signal.name: NO_DATA for signal in signals}
        states = self.refresh([signal.predict.model for signal in signals if signal.predict is not None])
        with self._lock:
            usable = {
                name: (self._loaded[name].artifact, self._loaded[name].spec)
                for name, state in states.items()
                if state.usable
            }
        if not usable:
            return results  # nothing to predict with: no feature queries either
        targets, matrix, failures = fetch_features(source, policy, at)
        predict_proba = self._probabilities or _default_probabilities()
        for name, (artifact, spec) in usable.items():
            model_signals = [s for s in signals if s.predict is not None and s.predict.model == name]
            if matrix.shape[1] and len(failures) / matrix.shape[1] > spec.max_missing_fraction:
                failed = SignalResult.failed(f"feature queries failed: {'; '.join(failures[:3])}")
                results.update({signal.name: failed for signal in model_signals})
                continue
            rows = usable_rows(matrix, spec.max_missing_fraction)
            if not rows.any():
                continue  # no target with enough features: no-data
            try:
                probabilities = single_threaded(predict_proba, artifact, matrix[rows])
            except Exception as failure:  # noqa: BLE001 - a model that cannot predict gives no-data, not a crash
                # Not sticky: the next evaluation's features may be fine (e.g. a NaN the model cannot take).
                self._note_failure(name, f"prediction failed: {type(failure).__name__}: {failure}")
                continue
            self._note_failure(name, None)
            kept = [target for target, keep in zip(targets, rows, strict=True) if keep]
            for signal in model_signals:
                assert signal.predict is not None
                dimension = signal.predict.dimension.value
                column = probabilities.get(dimension)
                if column is None:
                    self._note_dimension_gap(name, dimension)
                    continue
                values = np.asarray(column, dtype=float)
                results[signal.name] = SignalResult(
                    values={target: float(value) for target, value in zip(kept, values, strict=True)}
                )
        return results

    def _note_failure(self, model: str, reason: str | None) -> None:
        """Remember the model's last prediction failure; logged when it starts, changes or ends."""
        with self._lock:
            if self._failures.get(model) == reason:
                return
            if reason is None:
                self._failures.pop(model, None)
                logger.info("prediction model %s predicts again", model)
            else:
                self._failures[model] = reason
                logger.warning("prediction model %s: %s; its prediction signals are no-data", model, reason)

    def _note_dimension_gap(self, model: str, dimension: str) -> None:
        with self._lock:
            if (model, dimension) not in self._dimension_gaps:
                self._dimension_gaps.add((model, dimension))
                logger.warning("prediction model %s has no %s model; those signals are no-data", model, dimension)


_single_thread_lock = threading.Lock()
_threadpools: Any = None


def single_threaded(call: Callable[..., _T], *args: Any) -> _T:
    """`call(*args)` with OpenMP/BLAS limited to one thread.

    Why: a batch is at most a few thousand rows, and scikit-learn's gradient-boosting predict starts
    OpenMP workers that spin while waiting. On the 2-core controller machine shared with Prometheus and
    the serving tier, that made a 1000-target batch take 4.3 s at P50 instead of 36 ms single-threaded
    (tests/bench/bench_prediction.py under load). The limit is process-wide while it holds, so the lock
    keeps a concurrent evaluation from restoring the default in the middle of another's prediction.
    """
    global _threadpools
    with _single_thread_lock:
        if _threadpools is None:
            from threadpoolctl import ThreadpoolController  # a scikit-learn dependency

            _threadpools = ThreadpoolController()
        with _threadpools.limit(limits=1):
            return call(*args)


def _says_missing(error: BaseException) -> bool:
    return isinstance(error, FileNotFoundError) or getattr(error, "reason", None) == "missing"


def fetch_features(
    source: MetricsSource, policy: Policy, at: float | None
) -> tuple[list[TargetKey], np.ndarray[Any, np.dtype[np.float64]], list[str]]:
    """One instant query per feature for all targets: (targets, matrix with NaN for missing, failed features)."""
    group_by = list(policy.targets.groupBy)
    queries = feature_queries(policy.targets.match, group_by)
    results: dict[str, SignalResult] = {}
    failures: list[str] = []
    for feature, query in queries.items():
        try:
            result = source.instant(query, group_by, at)
        except Exception as unexpected:  # noqa: BLE001 - sources should not raise; one that does is an error
            result = SignalResult.failed(f"source raised {type(unexpected).__name__}: {unexpected}")
        if result.error is not None:
            failures.append(f"{feature}: {result.error}")
        results[feature] = result
    targets = sorted({target for result in results.values() for target in result.values})
    matrix = np.asarray(feature_matrix(results, targets), dtype=float)
    if matrix.ndim != 2:
        matrix = matrix.reshape(len(targets), -1)
    return targets, matrix, failures


def usable_rows(matrix: np.ndarray[Any, np.dtype[np.float64]], max_missing_fraction: float) -> np.ndarray[Any, Any]:
    """Rows (targets) whose fraction of missing features is at most `max_missing_fraction`."""
    if matrix.shape[0] == 0 or matrix.shape[1] == 0:
        return np.zeros(matrix.shape[0], dtype=bool)
    missing = np.isnan(matrix).mean(axis=1)
    return np.asarray(missing <= max_missing_fraction + 1e-12)
