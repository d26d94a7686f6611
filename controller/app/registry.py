"""A registry per port: which adapter answers a port is chosen by the configuration, not by code.

Each adapter family registers once (controller/app/registrations.py holds the built-in lines): its settings
section (where it sits in the configuration and its pydantic model, extra="forbid") and its factory. Then

- `build()` (controller/app/build.py) asks each port's registry for its port (`context.port(REGISTRY)`): the
  first configured entry in registration order, a fallback (the local tier) only when none is; or all of them,
  fanned out (the annotators);
- the configuration's schema is assembled from the registries (`assemble`, used by controller/app/settings.py):
  a section no settings class declares is added where its path says (`kubernetes.keda`: a field of the
  `kubernetes` section), so a new adapter's settings are validated, and refused, with the same file:line: field
  errors as every other section; a section a settings class declares (the built-ins: typed for the code that
  reads them) must be declared with the registered model;
- the policy check (`missing_actuators`) names the sections that would provide a missing action type
  (`PortRegistry.hint`).

Adding an actuator is one adapter folder, one settings model, one registry line (docs/architecture.md,
"Adding an actuator").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Any, Generic, TypeVar, Union, cast, get_args, get_origin

from pydantic import BaseModel, Field, create_model

from tailguard.controller.core.ports import Clock
from tailguard.controller.kit.errors import ConfigError

if TYPE_CHECKING:  # the cluster extra (kubernetes): only a `kubernetes` section builds a connection
    from kubernetes import client as k8s

    from tailguard.controller.adapters.kube.events import EventRecorder
    from tailguard.controller.kit.http import RetryPolicy

S = TypeVar("S")  # a section's settings
P = TypeVar("P")  # the port an adapter implements
M = TypeVar("M", bound=BaseModel)


class RegistryError(ConfigError):
    """A registration that cannot stand: a name or section taken twice, a section declared with another model."""


@dataclass(frozen=True)
class Section(Generic[S]):
    """Where an adapter's settings sit in the configuration (`kubernetes.hpa`, `argocd`) and their model."""

    path: str
    model: Any  # type[S]: a pydantic model (extra="forbid"), or the declared type of a built-in section
    description: str = ""

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.path.split("."))

    def of(self, settings: BaseModel) -> S | None:
        """This section's value in `settings`, or None when it is absent (or an empty mapping: no receivers)."""
        value: Any = settings
        for part in self.parts:
            value = getattr(value, part, None)
            if value is None:
                return None
        return None if isinstance(value, Mapping) and not value else cast("S", value)


@dataclass(frozen=True)
class ClusterConnection:
    """The one Kubernetes API client of a configuration with a `kubernetes` section, and what its actuators share
    (controller/app/cluster.py `connect` makes it)."""

    api_client: k8s.ApiClient
    namespace: str
    timeout: float
    retry: RetryPolicy
    events: EventRecorder | None


@dataclass
class BuildContext:
    """What every factory may use: the clock, where relative paths and state live, the caller's ExitStack (a part
    that holds a resource registers its close there), the cluster connection, and the other ports (`port`)."""

    settings: BaseModel  # the configuration being built (its sections are read through the registries)
    clock: Clock
    base_dir: Path
    state_dir: Path | None  # None: nothing is kept across restarts (tests that build one actuator)
    stack: ExitStack
    cluster: ClusterConnection | None = None
    _made: dict[str, Any] = field(default_factory=dict)

    def path(self, raw: str | Path) -> Path:
        """A configured path: relative ones against the configuration file's directory."""
        candidate = Path(raw).expanduser()
        return candidate if candidate.is_absolute() else Path(os.path.normpath(self.base_dir / candidate))

    def once(self, key: str, make: Callable[[], P]) -> P:
        """One part shared by several ports (the local tier client, the HPA scaler): made at its first use."""
        if key not in self._made:
            self._made[key] = make()
        return cast("P", self._made[key])

    def port(self, registry: PortRegistry[P]) -> P | None:
        """Another port, as its registry chooses it (made once)."""
        return self.once(f"port:{registry.port}:{id(registry)}", lambda: registry.choose(self))

    def state_file(self, name: str) -> Path | None:
        return self.state_dir / name if self.state_dir is not None else None

    def require_cluster(self, section: str) -> ClusterConnection:
        if self.cluster is None:
            raise ConfigError(f"{section} needs the `kubernetes` section (the cluster connection)")
        return self.cluster


@dataclass(frozen=True)
class Adapter(Generic[S, P]):
    """One implementation of a port: its name, its settings section and the factory that makes it from them."""

    name: str
    section: Section[S]
    factory: Callable[[S, BuildContext], P]
    fallback: bool = False  # chosen only when no other entry is configured (the local tier)

    def build(self, settings: S, context: BuildContext) -> P:
        return self.factory(settings, context)


class PortRegistry(Generic[P]):
    """The adapters of one port. With `combine`, every configured one is used (fanned out by `combine`); else the
    first configured one in registration order (fallbacks last). `exclusive`: two configured non-fallback entries
    are a configuration error (`verb` says what they both do), never a silent choice."""

    def __init__(
        self,
        port: str,
        *,
        verb: str = "",
        exclusive: bool = False,
        combine: Callable[[list[P]], P] | None = None,
    ) -> None:
        self.port = port
        self.verb = verb or f"answer {port}"
        self.exclusive = exclusive
        self.combine = combine
        self._entries: list[Adapter[Any, P]] = []

    def __repr__(self) -> str:
        return f"PortRegistry({self.port!r}, {[entry.name for entry in self._entries]})"

    @property
    def entries(self) -> tuple[Adapter[Any, P], ...]:
        return (*[e for e in self._entries if not e.fallback], *[e for e in self._entries if e.fallback])

    def register(self, adapter: Adapter[S, P]) -> Adapter[S, P]:
        """Add an adapter (the registry line). Its name and section must be new to this port."""
        for entry in self._entries:
            if entry.name == adapter.name or entry.section.path == adapter.section.path:
                raise RegistryError(f"{self.port}: {adapter.name!r} ({adapter.section.path}) is already registered")
        self._entries.append(adapter)
        return adapter

    def unregister(self, name: str) -> None:
        self._entries = [entry for entry in self._entries if entry.name != name]

    @contextmanager
    def registered(self, adapter: Adapter[S, P]) -> Iterator[Adapter[S, P]]:
        """The adapter registered for the `with` block (tests, embedders), removed after it."""
        self.register(adapter)
        try:
            yield adapter
        finally:
            self.unregister(adapter.name)

    def configured(self, settings: BaseModel) -> list[tuple[Adapter[Any, P], Any]]:
        """The entries whose section `settings` has, with their section's value, in the order they are chosen."""
        found = [(entry, entry.section.of(settings)) for entry in self.entries]
        return [(entry, value) for entry, value in found if value is not None]

    def provided(self, settings: BaseModel) -> bool:
        return bool(self.configured(settings))

    def hint(self) -> str:
        """The sections that provide this port, for a refusal: "an `argocd` or `kubernetes.rollback` section (or
        `tier`)"."""
        main = sorted(f"`{entry.section.path}`" for entry in self._entries if not entry.fallback)
        fallbacks = sorted(f"`{entry.section.path}`" for entry in self._entries if entry.fallback)
        text = ""
        if main:
            text = f"{'an' if main[0][1] in 'aeiou' else 'a'} {' or '.join(main)} section"
        if fallbacks:
            text = f"{text} (or {' or '.join(fallbacks)})" if text else " or ".join(fallbacks)
        return text

    def choose(self, context: BuildContext) -> P | None:
        """The port the configuration selects (None: no entry is configured); `context.port(registry)` makes it
        once per build."""
        configured = self.configured(context.settings)
        if self.exclusive:
            chosen = [entry.section.path for entry, _ in configured if not entry.fallback]
            if len(chosen) > 1:
                raise ConfigError(f"{' and '.join(chosen)} both {self.verb}: configure one of them")
        if self.combine is not None:
            parts = [entry.build(value, context) for entry, value in configured]
            return None if not parts else parts[0] if len(parts) == 1 else self.combine(parts)
        if not configured:
            return None
        entry, value = configured[0]
        return entry.build(value, context)


def sections(registries: Iterable[PortRegistry[Any]]) -> list[Section[Any]]:
    """Every registered section once (a section several ports share, such as `tier`, counts once)."""
    by_path: dict[str, Section[Any]] = {}
    for registry in registries:
        for entry in registry.entries:
            known = by_path.setdefault(entry.section.path, entry.section)
            if known.model != entry.section.model:
                raise RegistryError(f"{entry.section.path}: registered with two models")
    return list(by_path.values())


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model of a field declared `M` or `M | None`."""
    candidates = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
    return models[0] if len(models) == 1 else None


def _declares(annotation: Any, model: Any) -> bool:
    return annotation is model or annotation == model or model in get_args(annotation)


def assemble(base: type[M], registered: Iterable[Section[Any]]) -> type[M]:
    """`base` with every registered section it does not declare added as an optional field, one level of nesting
    deep (`kubernetes.keda` becomes a field of the `kubernetes` section's model); `base` itself when it declares
    them all. A declared section must be declared with its registered model."""
    added: dict[str, Any] = {}
    nested: dict[str, list[Section[Any]]] = {}
    for section in registered:
        head, *rest = section.parts
        declared = base.model_fields.get(head)
        if not rest:
            if declared is not None:
                if not _declares(declared.annotation, section.model):
                    raise RegistryError(f"{section.path}: declared as {declared.annotation}, registered otherwise")
                continue
            added[head] = (section.model | None, Field(default=None, description=section.description))
            continue
        if declared is None or _model_of(declared.annotation) is None:
            raise RegistryError(f"{section.path}: {head!r} is not a section that holds others")
        nested.setdefault(head, []).append(Section(".".join(rest), section.model, section.description))
    for head, inner in nested.items():
        declared = base.model_fields[head]
        model = _model_of(declared.annotation)
        assert model is not None
        grown = assemble(model, inner)
        if grown is not model:
            added[head] = (grown | None, Field(default=declared.default, description=declared.description))
    if not added:
        return base
    return create_model(base.__name__, __base__=base, __module__=base.__module__, **added)
