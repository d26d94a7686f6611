"""tailguard's controller, and its public face: what a program embedding the loop imports (`from controller
import embed_loop, Journal, ...`).

The serving lab (serving/), a client of the controller, imports nothing else of it (pyproject.toml
[tool.importlinter], contract `serving-through-the-face`); the controller's own layers never import this module.
The face: the whole controller built from its settings (`load_settings`, `build`: controller/app/build.py, the
controller's composition root), the loop embedded in a program (`embed_loop`: journal, incident layer,
journal-first dispatcher and the evaluation's ports wired once, controller/loop/embedding.py;
`EmbeddedLoop.evaluate` is the live evaluation), the backtest (`run_backtest`, `WouldRun`), the incident report,
the journal and the Prometheus source, the core's types, the kit's clocks, error tree and located YAML, and
`testing` (a public fake of every port).

The names load when first used (PEP 562 `__getattr__`): importing one module of the controller (`import
tailguard.controller.kit.errors`, as the predictors and the serving tier do) costs that module, not the whole face. The
imports below under TYPE_CHECKING are the same names, for the type checker and for import-linter (which counts
them), and tests/unit/test_public_face.py holds the two lists equal. No module the face names imports this one,
so the face hides no import circle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tailguard.controller import testing
    from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
    from tailguard.controller.adapters.stores.journal import Journal
    from tailguard.controller.app.build import Application, build
    from tailguard.controller.app.settings import ControllerSettings, load_settings
    from tailguard.controller.core.engine import PolicyState, transition
    from tailguard.controller.core.model import Decision, DecisionKind, SignalResult, target_key
    from tailguard.controller.core.policy import ForSpec, Policy
    from tailguard.controller.core.policy_files import load_policies
    from tailguard.controller.core.ports import (
        ActionOutcome,
        Clock,
        MetricsSource,
        OutcomeStatus,
        RangeResult,
        ScaleRequest,
        ScaleState,
    )
    from tailguard.controller.kit.clock import ManualClock, SystemClock
    from tailguard.controller.kit.errors import ConfigError, InputError, TailguardError
    from tailguard.controller.kit.located_yaml import (
        BoundedLoader,
        DuplicateKey,
        FileTooLarge,
        Located,
        construct,
        field_path,
        line_for,
        read_bounded,
        yaml_problem,
    )
    from tailguard.controller.loop.dispatcher import Actuators, GlobalLimits
    from tailguard.controller.loop.embedding import (
        EmbeddedDispatcher,
        EmbeddedLoop,
        embed_dispatcher,
        embed_loop,
    )
    from tailguard.controller.loop.evaluation import EvaluationOutcome, EvaluationPorts, evaluate
    from tailguard.controller.loop.ports import LoopJournalPort
    from tailguard.controller.tools.backtest import BacktestReport, run_backtest
    from tailguard.controller.tools.backtest_world import WouldRun
    from tailguard.controller.tools.incident_report import IncidentTimeline, write_report

# name -> the module that defines it, relative to this package (the names survive a rename of the package)
_HOMES: dict[str, str] = {
    "Application": ".app.build",
    "build": ".app.build",
    "ControllerSettings": ".app.settings",
    "load_settings": ".app.settings",
    "EmbeddedDispatcher": ".loop.embedding",
    "EmbeddedLoop": ".loop.embedding",
    "embed_dispatcher": ".loop.embedding",
    "embed_loop": ".loop.embedding",
    "Actuators": ".loop.dispatcher",
    "GlobalLimits": ".loop.dispatcher",
    "EvaluationOutcome": ".loop.evaluation",
    "EvaluationPorts": ".loop.evaluation",
    "evaluate": ".loop.evaluation",
    "BacktestReport": ".tools.backtest",
    "run_backtest": ".tools.backtest",
    "WouldRun": ".tools.backtest_world",
    "IncidentTimeline": ".tools.incident_report",
    "write_report": ".tools.incident_report",
    "Journal": ".adapters.stores.journal",
    "PrometheusSettings": ".adapters.metrics.prometheus",
    "PrometheusSource": ".adapters.metrics.prometheus",
    "PolicyState": ".core.engine",
    "transition": ".core.engine",
    "Decision": ".core.model",
    "DecisionKind": ".core.model",
    "SignalResult": ".core.model",
    "target_key": ".core.model",
    "ForSpec": ".core.policy",
    "Policy": ".core.policy",
    "load_policies": ".core.policy_files",
    "ActionOutcome": ".core.ports",
    "Clock": ".core.ports",
    "MetricsSource": ".core.ports",
    "LoopJournalPort": ".loop.ports",
    "OutcomeStatus": ".core.ports",
    "RangeResult": ".core.ports",
    "ScaleRequest": ".core.ports",
    "ScaleState": ".core.ports",
    "ManualClock": ".kit.clock",
    "SystemClock": ".kit.clock",
    "ConfigError": ".kit.errors",
    "InputError": ".kit.errors",
    "TailguardError": ".kit.errors",
    "BoundedLoader": ".kit.located_yaml",
    "DuplicateKey": ".kit.located_yaml",
    "FileTooLarge": ".kit.located_yaml",
    "Located": ".kit.located_yaml",
    "construct": ".kit.located_yaml",
    "field_path": ".kit.located_yaml",
    "line_for": ".kit.located_yaml",
    "read_bounded": ".kit.located_yaml",
    "yaml_problem": ".kit.located_yaml",
}
# modules of the face
_MODULES: dict[str, str] = {"testing": ".testing"}

__all__ = [
    "ActionOutcome",
    "Actuators",
    "Application",
    "BacktestReport",
    "BoundedLoader",
    "Clock",
    "ConfigError",
    "ControllerSettings",
    "Decision",
    "DecisionKind",
    "DuplicateKey",
    "EmbeddedDispatcher",
    "EmbeddedLoop",
    "EvaluationOutcome",
    "EvaluationPorts",
    "FileTooLarge",
    "ForSpec",
    "GlobalLimits",
    "IncidentTimeline",
    "InputError",
    "Journal",
    "Located",
    "LoopJournalPort",
    "ManualClock",
    "MetricsSource",
    "OutcomeStatus",
    "Policy",
    "PolicyState",
    "PrometheusSettings",
    "PrometheusSource",
    "RangeResult",
    "ScaleRequest",
    "ScaleState",
    "SignalResult",
    "SystemClock",
    "TailguardError",
    "WouldRun",
    "build",
    "construct",
    "embed_dispatcher",
    "embed_loop",
    "evaluate",
    "field_path",
    "line_for",
    "load_policies",
    "load_settings",
    "read_bounded",
    "run_backtest",
    "target_key",
    "testing",
    "transition",
    "write_report",
    "yaml_problem",
]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value: Any = importlib.import_module(_MODULES[name], __name__)
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
