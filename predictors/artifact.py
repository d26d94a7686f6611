"""The trained SLA model on disk: a versioned directory that is safe to load.

    DIR/metadata.json   format version, feature names and hash, horizon, SLI thresholds, decision
                        thresholds, sklearn version, training window, report, sha256 of model.skops
    DIR/model.skops     the fitted estimators (skops.io: no pickle; only allow-listed types are built)

`load_artifact` checks, in this order, and raises ArtifactError with one clear sentence otherwise:
the files exist, metadata is valid JSON of this format, model.skops has the recorded sha256 (corrupt or
tampered files are refused before skops reads them), every feature it names exists and the feature hash equals
the running code's `feature_hash(names)` over those names (an artifact trained before features were added
loads; predictions pick its columns by name), the sklearn MAJOR version matches, and every type in model.skops
is allow-listed.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import sklearn
import skops.io as sio
from threadpoolctl import ThreadpoolController

from tailguard.controller.kit.errors import ConfigError
from tailguard.predictors.features import feature_hash, feature_names

DIMENSIONS = ("cpu", "gpu", "network")
FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
MODEL_FILE = "model.skops"

# The types the training code produces (HistGradientBoostingClassifier and LogisticRegression pipelines,
# calibrated). skops builds these without pickle; anything else in a file is refused unless trusted.
TRUSTED_TYPES: tuple[str, ...] = (
    "builtins.NoneType",
    "builtins.dict",
    "builtins.list",
    "builtins.str",
    "builtins.tuple",
    "numpy.dtype",
    "numpy.float64",
    "numpy.int64",
    "numpy.ndarray",
    "numpy.random.RandomState",
    "numpy.random._mt19937.MT19937",
    "sklearn._loss.link.Interval",
    "sklearn._loss.link.LogitLink",
    "sklearn._loss.loss.HalfBinomialLoss",
    "sklearn.calibration.CalibratedClassifierCV",
    "sklearn.calibration._CalibratedClassifier",
    "sklearn.calibration._SigmoidCalibration",
    "sklearn.ensemble._hist_gradient_boosting.binning._BinMapper",
    "sklearn.ensemble._hist_gradient_boosting.gradient_boosting.HistGradientBoostingClassifier",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    "sklearn.frozen._frozen.FrozenEstimator",
    "sklearn.impute._base.SimpleImputer",
    "sklearn.isotonic.IsotonicRegression",
    "sklearn.linear_model._logistic.LogisticRegression",
    "sklearn.pipeline.Pipeline",
    "sklearn.preprocessing._data.StandardScaler",
    "sklearn.utils._bunch.Bunch",
)


_THREADPOOLS = ThreadpoolController()


def single_threaded() -> Any:
    """A context in which OpenMP (the GBM's predict and fit) uses one thread.

    On a busy 2-core machine OpenMP's spinning threads made a 1000-target prediction take 2 s at P99
    instead of 0.05 s; one thread is also what a per-evaluation batch of targets needs.
    """
    return _THREADPOOLS.limit(limits=1, user_api="openmp")


class ArtifactError(ConfigError):
    """A model directory that cannot be used; `reason` is a short machine-readable cause."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class ModelArtifact:
    models: dict[str, Any]  # dimension -> fitted calibrated classifier (predict_proba)
    feature_names: list[str]
    feature_hash: str
    horizon_s: float
    thresholds: dict[str, float]  # SLI threshold (seconds) per dimension: breach = SLI > threshold
    decision_thresholds: dict[str, float]  # probability per dimension at or above which the model alarms
    sklearn_version: str
    trained_window: tuple[float, float]  # (start, end) unix seconds of the training data
    created_at: float
    report: dict[str, Any] = field(default_factory=dict)
    baselines: dict[str, Any] = field(default_factory=dict)  # dimension -> logistic-regression baseline
    format_version: int = FORMAT_VERSION

    @property
    def dimensions(self) -> list[str]:
        return [d for d in DIMENSIONS if d in self.models]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def save_artifact(artifact: ModelArtifact, directory: str | Path) -> Path:
    """Write the artifact into `directory` (created); returns the directory."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    model_path = target / MODEL_FILE
    sio.dump({"models": artifact.models, "baselines": artifact.baselines}, model_path)
    metadata = {
        "format_version": artifact.format_version,
        "feature_names": list(artifact.feature_names),
        "feature_hash": artifact.feature_hash,
        "horizon_s": artifact.horizon_s,
        "thresholds": artifact.thresholds,
        "decision_thresholds": artifact.decision_thresholds,
        "sklearn_version": artifact.sklearn_version,
        "trained_window": list(artifact.trained_window),
        "created_at": artifact.created_at,
        "dimensions": sorted(artifact.models),
        "model_sha256": _sha256(model_path),
        "report": artifact.report,
    }
    (target / METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True, default=_json_default) + "\n")
    return target


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _major(version: str) -> str:
    return version.split(".", 1)[0]


def _field(metadata: dict[str, Any], name: str, kind: type | tuple[type, ...], where: Path) -> Any:
    value = metadata.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ArtifactError("corrupt", f"{where}: field {name!r} must be {expected}, got {type(value).__name__}")
    return value


def load_artifact(
    directory: str | Path, *, trusted_types: Sequence[str] = (), allow_untrusted: bool = False
) -> ModelArtifact:
    """Load and verify a model directory; raises ArtifactError (never a traceback of skops or JSON)."""
    base = Path(directory)
    metadata_path, model_path = base / METADATA_FILE, base / MODEL_FILE
    for path in (metadata_path, model_path):
        if not path.is_file():
            raise ArtifactError("missing", f"{path}: model file is missing (train one with `tailguard train`)")
    try:
        metadata = json.loads(metadata_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError("corrupt", f"{metadata_path}: not valid JSON: {exc}") from None
    if not isinstance(metadata, dict):
        raise ArtifactError("corrupt", f"{metadata_path}: expected a JSON object")
    version = _field(metadata, "format_version", int, metadata_path)
    if version != FORMAT_VERSION:
        raise ArtifactError(
            "format", f"{metadata_path}: format_version {version} is not supported (expected {FORMAT_VERSION})"
        )
    expected_sha = _field(metadata, "model_sha256", str, metadata_path)
    if _sha256(model_path) != expected_sha:
        raise ArtifactError("corrupt", f"{model_path}: sha256 differs from metadata.json (corrupt or modified)")
    names = _field(metadata, "feature_names", list, metadata_path)
    recorded_hash = _field(metadata, "feature_hash", str, metadata_path)
    # The hash over the artifact's OWN feature names with this version's queries: a model trained before features
    # were added still loads (its columns are picked by name), one whose features changed meaning does not.
    unknown = [str(name) for name in names if str(name) not in feature_names()]
    if unknown:
        raise ArtifactError(
            "feature-hash",
            f"{metadata_path}: trained on features this version does not have ({', '.join(unknown[:5])}); "
            "retrain the model with this version",
        )
    running_hash = feature_hash([str(name) for name in names])
    if recorded_hash != running_hash:
        raise ArtifactError(
            "feature-hash",
            f"{metadata_path}: feature hash {recorded_hash[:12]} does not match this version's features "
            f"({running_hash[:12]}): a feature's query changed since; retrain the model with this version",
        )
    trained_with = _field(metadata, "sklearn_version", str, metadata_path)
    if _major(trained_with) != _major(sklearn.__version__):
        raise ArtifactError(
            "sklearn-version",
            f"{metadata_path}: trained with scikit-learn {trained_with}, running {sklearn.__version__} "
            "(different major version); retrain the model",
        )
    allowed = set(TRUSTED_TYPES) | set(trusted_types)
    try:
        found = sio.get_untrusted_types(file=model_path)
    except Exception as exc:  # skops raises many types on a damaged file; all mean "corrupt"
        raise ArtifactError("corrupt", f"{model_path}: not a readable skops file: {exc}") from exc
    untrusted = sorted(set(found) - allowed)
    if untrusted and not allow_untrusted:
        raise ArtifactError(
            "untrusted-type",
            f"{model_path}: contains types that are not allow-listed: {', '.join(untrusted)} "
            "(pass them as trusted types only if you trust where this file came from)",
        )
    try:
        payload = sio.load(model_path, trusted=sorted(allowed | set(found)) if allow_untrusted else sorted(allowed))
    except Exception as exc:  # see above
        raise ArtifactError("corrupt", f"{model_path}: cannot be loaded: {type(exc).__name__}: {exc}") from exc
    if not isinstance(payload, dict) or not isinstance(payload.get("models"), dict):
        raise ArtifactError("corrupt", f"{model_path}: expected a dict with 'models'")
    window = _field(metadata, "trained_window", list, metadata_path)
    thresholds = _field(metadata, "thresholds", dict, metadata_path)
    decision = _field(metadata, "decision_thresholds", dict, metadata_path)
    horizon = float(_field(metadata, "horizon_s", (int, float), metadata_path))
    if len(window) != 2 or not math.isfinite(horizon) or horizon <= 0:
        raise ArtifactError("corrupt", f"{metadata_path}: trained_window needs 2 times and horizon_s > 0")
    return ModelArtifact(
        models=dict(payload["models"]),
        feature_names=[str(n) for n in names],
        feature_hash=recorded_hash,
        horizon_s=horizon,
        thresholds={str(k): float(v) for k, v in thresholds.items()},
        decision_thresholds={str(k): float(v) for k, v in decision.items()},
        sklearn_version=trained_with,
        trained_window=(float(window[0]), float(window[1])),
        created_at=float(_field(metadata, "created_at", (int, float), metadata_path)),
        report=dict(metadata.get("report") or {}),
        baselines=dict(payload.get("baselines") or {}),
        format_version=version,
    )


def model_columns(artifact: ModelArtifact, X: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The artifact's columns of a feature matrix: X in FEATURES order (what the controller and the backtest
    fetch) or already in the artifact's order (its own training rows)."""
    every = feature_names()
    if X.ndim == 2 and X.shape[1] == len(every) and artifact.feature_names != every:
        return X[:, [every.index(name) for name in artifact.feature_names]]
    if X.ndim != 2 or X.shape[1] != len(artifact.feature_names):
        raise ValueError(
            f"expected a matrix of shape (n, {len(artifact.feature_names)}) or (n, {len(every)}), got {X.shape}"
        )
    return X


def predict_proba(artifact: ModelArtifact, X: npt.NDArray[np.float64]) -> dict[str, npt.NDArray[np.float64]]:
    """Breach probability per dimension, shape (n_targets,), for a feature matrix in FEATURES order (or in the
    artifact's own feature order)."""
    X = model_columns(artifact, X)
    if X.shape[0] == 0:
        return {d: np.zeros(0, dtype=np.float64) for d in artifact.dimensions}
    with single_threaded():
        return {
            dimension: np.asarray(artifact.models[dimension].predict_proba(X)[:, 1], dtype=np.float64)
            for dimension in artifact.dimensions
        }
