"""Policies: the YAML that SREs write, as strict Pydantic models.

A policy names its targets (the labels that identify one), its signals (one
batched PromQL query each), its conditions (threshold, `for`, explicit no-data
policy, staleness and source-error limits, actions, recovery) and its limits
(cooldown and action budget). Unknown fields are errors, never ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    model_validator,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from tailguard.controller.core.actions import Action
from tailguard.controller.kit.durations import format_duration, parse_duration
from tailguard.controller.kit.errors import ConfigError
from tailguard.controller.kit.templating import LABEL_NAME, QUERY_BUILTINS, variables_in

API_VERSION = "tailguard.io/v1alpha1"
DURATION_PATTERN = r"^(\d+(\.\d+)?(ms|s|m|h|d))+$"


class PolicyReferenceError(ConfigError, ValueError):
    """A cross-reference error that knows where it is (policy_files maps `loc` to a file line)."""

    def __init__(self, message: str, loc: tuple[str | int, ...]):
        super().__init__(message)
        self.loc = loc


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _seconds(value: Any) -> Any:
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, bool):
        # ValueError, not TypeError: pydantic turns only ValueError into a located validation error.
        raise ValueError("expected a duration such as '15s', '5m' or '1h30m'")  # noqa: TRY004
    return value


Duration = Annotated[
    float,
    BeforeValidator(_seconds),
    Field(ge=0),
    PlainSerializer(format_duration, return_type=str),
    # A bare number is accepted as seconds by the validator, so the schema accepts it too.
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": DURATION_PATTERN},
                {"type": "number", "minimum": 0, "description": "seconds"},
            ],
            "description": "A duration such as 15s, 5m or 1h30m",
        }
    ),
]


# Streak times are compared at millisecond precision (as decision ids name onsets): nominal evaluation times
# such as start + k x interval are exact only up to float rounding, which must not cost a whole interval.
TIME_TOLERANCE = 1e-3


@dataclass(frozen=True)
class ForSpec:
    """How long a breach must last: N consecutive breaching evaluations, or a duration."""

    count: int | None = None
    seconds: float | None = None

    def satisfied(self, streak_count: int, streak_started: float, now: float, *, interval: float = 0.0) -> bool:
        """Count form: `streak_count` >= N observations spanning at least (N-1) x `interval` (the policy's
        interval: evaluations triggered between scheduled ones add observations but never shorten the streak;
        `interval` 0 counts observations only). Duration form: at least `seconds` since the streak started."""
        if self.count is not None:
            span = (self.count - 1) * interval
            return streak_count >= self.count and now - streak_started >= span - TIME_TOLERANCE
        assert self.seconds is not None
        return streak_count >= 1 and now - streak_started >= self.seconds - TIME_TOLERANCE

    def describe(self) -> str:
        if self.count is not None:
            return f"{self.count} consecutive evaluations"
        assert self.seconds is not None
        return format_duration(self.seconds)


def _for_spec(value: Any) -> ForSpec:
    if isinstance(value, ForSpec):
        return value
    if isinstance(value, bool):
        raise ValueError("expected a count of evaluations (integer >= 1) or a duration such as '60s'")  # noqa: TRY004
    if isinstance(value, int):
        if value < 1:
            raise ValueError("a count of evaluations must be at least 1")
        return ForSpec(count=value)
    if isinstance(value, str):
        return ForSpec(seconds=parse_duration(value))
    raise ValueError("expected a count of evaluations (integer >= 1) or a duration such as '60s'")


def _for_serialize(spec: ForSpec) -> int | str:
    if spec.count is not None:
        return spec.count
    assert spec.seconds is not None
    return format_duration(spec.seconds)


For = Annotated[
    ForSpec,
    BeforeValidator(_for_spec),
    PlainSerializer(_for_serialize),
    WithJsonSchema(
        {
            "oneOf": [
                {"type": "integer", "minimum": 1, "description": "consecutive breaching evaluations"},
                {
                    "type": "string",
                    "pattern": DURATION_PATTERN,
                    "description": "breaching for at least this long",
                },
            ]
        }
    ),
]


def _label_name(value: str) -> str:
    if not LABEL_NAME.match(value):
        raise ValueError(f"expected a Prometheus label name ([A-Za-z_][A-Za-z0-9_]*), got {value!r}")
    return value


LABEL_NAME_PATTERN = LABEL_NAME.pattern
LabelName = Annotated[
    str,
    BeforeValidator(lambda v: _label_name(v) if isinstance(v, str) else v),
    WithJsonSchema({"type": "string", "pattern": LABEL_NAME_PATTERN}),
]
Identifier = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")]


class Comparison(StrEnum):
    GT = ">"
    GE = ">="
    LT = "<"
    LE = "<="

    def holds(self, value: float, threshold: float) -> bool:
        if self is Comparison.GT:
            return value > threshold
        if self is Comparison.GE:
            return value >= threshold
        if self is Comparison.LT:
            return value < threshold
        return value <= threshold


class NoDataPolicy(StrEnum):
    HOLD = "hold"  # keep the current streak as it is (neither a breach nor a recovery)
    BREACH = "breach"  # absence is itself the failure (e.g. a heartbeat)
    OK = "ok"  # absence means healthy (e.g. an error counter that only exists on errors)


class Threshold(StrictModel):
    op: Comparison = Field(description="comparison of the observed value against `value`")
    value: float = Field(description="threshold in the signal's unit (seconds, ratio, count)")

    @model_validator(mode="after")
    def _finite(self) -> Threshold:
        if not math.isfinite(self.value):
            raise ValueError("threshold value must be a finite number")
        return self

    def holds(self, observed: float) -> bool:
        return self.op.holds(observed, self.value)


class TargetSpec(StrictModel):
    groupBy: list[LabelName] = Field(
        min_length=1, description="labels that identify one target; every signal must return them"
    )
    match: dict[LabelName, str] = Field(
        default_factory=dict,
        description="equality matchers: available in queries as {{ selector }} and as variables, "
        "and used to route Alertmanager alerts to this policy",
    )


class SlaDimension(StrEnum):
    CPU = "cpu"  # scheduling: request queue time
    GPU = "gpu"  # engine inference time (prefill + decode), HBM/DRAM where DCGM exists
    NETWORK = "network"  # router-observed latency minus engine-reported latency


class Prediction(StrictModel):
    """A learned signal: the SLA model's probability that `dimension` breaches within its horizon."""

    model: str = Field(min_length=1, description="a model named in the controller configuration's `predictors`")
    dimension: SlaDimension


class Signal(StrictModel):
    name: Identifier
    query: str | None = Field(
        default=None,
        min_length=1,
        description="PromQL returning one series per target, grouped by the target labels. "
        "{{ selector }}, {{ by }} and {{ variable }} (an escaped string literal) are substituted.",
    )
    predict: Prediction | None = Field(
        default=None,
        description="instead of a query: the breach probability (0..1) predicted by a trained SLA model; a missing, "
        "stale or incompatible model makes it no-data, never a breach",
    )

    @model_validator(mode="after")
    def _query_or_prediction(self) -> Signal:
        if (self.query is None) == (self.predict is None):
            raise ValueError("a signal needs exactly one of `query` (PromQL) or `predict` (a trained SLA model)")
        return self


class Recovery(StrictModel):
    when: Threshold | None = Field(
        default=None, description="healthy when this holds; default: the breach threshold does not hold"
    )
    for_: For = Field(default=ForSpec(count=1), alias="for")
    actions: list[Action] = Field(default_factory=list)


class AttributionSpec(StrictModel):
    """Which rollouts a breach may be attributed to: same target labels, within `window` before the onset."""

    window: Duration = Field(default=1800.0, description="a rollout at most this long before the onset counts")
    labels: list[LabelName] = Field(
        min_length=1, description="target labels a rollout must share with the target (e.g. [service])"
    )


class BranchIf(StrictModel):
    """A branch's guard; every field given must hold (a signal test needs `signal`, `op` and `value`)."""

    attributedToRollout: bool | None = Field(
        default=None, description="true: the breach is attributed to a rollout; false: it is not"
    )
    signal: Identifier | None = Field(
        default=None, description="a signal of this policy, read from the same evaluation (e.g. saturation)"
    )
    op: Comparison | None = None
    value: float | None = None

    @model_validator(mode="after")
    def _complete(self) -> BranchIf:
        given = [self.signal is not None, self.op is not None, self.value is not None]
        if any(given) and not all(given):
            raise ValueError("a signal test needs all of `signal`, `op` and `value`")
        if self.attributedToRollout is None and not any(given):
            raise ValueError("`if` needs `attributedToRollout` or a signal test (`signal`, `op`, `value`)")
        if self.value is not None and not math.isfinite(self.value):
            raise ValueError("`value` must be a finite number")
        return self


class Branch(StrictModel):
    name: Identifier
    if_: BranchIf | None = Field(default=None, alias="if", description="no `if`: otherwise (must be the last branch)")
    actions: list[Action] = Field(min_length=1)


class Condition(StrictModel):
    name: Identifier
    signal: Identifier
    when: Threshold = Field(description="a breach is an observation for which this holds")
    for_: For = Field(alias="for")
    noData: NoDataPolicy = Field(description="what an absent or NaN value means; there is no default on purpose")
    staleAfter: Duration = Field(
        default=300.0,
        description="held state older than this is dropped: stale data never completes a breach",
    )
    maxSourceErrors: int = Field(
        default=4, ge=1, description="consecutive source errors tolerated before the condition is 'errored'"
    )
    actions: list[Action] = Field(
        default_factory=list, description="what to do when it fires (exactly one of `actions` or `choose`)"
    )
    attribution: AttributionSpec | None = Field(
        default=None, description="tie a breach to the most recent rollout of the same target before its onset"
    )
    choose: list[Branch] | None = Field(
        default=None,
        min_length=1,
        description="ordered branches; the first whose `if` holds at fire time runs its actions",
    )
    recovery: Recovery = Field(default_factory=Recovery)

    @model_validator(mode="after")
    def _actions_or_choose(self) -> Condition:
        if bool(self.actions) == (self.choose is not None):
            raise ValueError("a condition needs exactly one of `actions` (a non-empty list) or `choose` (branches)")
        return self

    def all_actions(self) -> list[Any]:
        """Every action the condition may run when it fires: its `actions`, or those of every branch."""
        if self.choose is None:
            return list(self.actions)
        return [action for branch in self.choose for action in branch.actions]


class Limits(StrictModel):
    cooldown: Duration = Field(default=300.0, description="minimum time between mutating actions on one target")
    maxActionsPerHour: int = Field(default=6, ge=0, description="mutating actions per target in any hour")
    actionDeadline: Duration | None = Field(
        default=None,
        description="how long after its decision a mutating action may still start (default: 3 evaluation "
        "intervals, at least 60s); past it the action is never run, at a restart or ever (`expired`)",
    )


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class EscalationStep(StrictModel):
    """One rung of the ladder: what the incident does when the action before it did not end the breach."""

    name: Identifier = Field(description="shown in the incident's status (`next step`) and its annotation")
    severity: Severity = Field(default=Severity.CRITICAL, description="sent with the notification of this step")
    actions: list[Action] = Field(
        min_length=1, description="notify on-call, scale out, shift traffic away; never `rollback` nor `restore`"
    )


class Escalation(StrictModel):
    """What an incident does when an action did not end the breach (controller/core/incidents.py)."""

    verifyAfter: Duration = Field(
        default=300.0,
        description="how long each action has to end the breach; past it, with the breach still held, the "
        "incident moves to the next step",
    )
    receiver: str = Field(
        default="oncall",
        min_length=1,
        description="the receiver of the default step (no `steps`): one notification, never a second rollback",
    )
    steps: list[EscalationStep] = Field(
        default_factory=list, description="the ladder, in order; empty: notify `receiver` with severity critical"
    )

    @model_validator(mode="after")
    def _no_second_rollback(self) -> Escalation:
        for index, step in enumerate(self.steps):
            for position, action in enumerate(step.actions):
                if action.type in ("rollback", "restore"):
                    raise PolicyReferenceError(
                        f"an escalation step may not {action.type}: a rollback that did not end the breach is "
                        "followed by a human, never by a second rollback",
                        ("steps", index, "actions", position, "type"),
                    )
        return self


TEXT_VARIABLES = frozenset({"value", "threshold", "policy", "condition", "target", "onset", "decision_id"})
# What attribution adds to action text (empty / "none" when the breach is not attributed to a rollout).
ATTRIBUTION_VARIABLES = frozenset({"rollout_revision", "rollout_diff", "branch"})


class Policy(StrictModel):
    apiVersion: Literal["tailguard.io/v1alpha1"]
    kind: Literal["Policy"]
    name: Identifier
    description: str = ""
    interval: Duration = Field(default=15.0, description="evaluation interval")
    dryRun: bool = Field(default=False, description="decide and journal, but execute no action")
    suspend: bool = Field(
        default=False,
        description="stop new mutating actions at once (like a CronJob's suspend): a breach that would fire is "
        "journaled as suppressed with reason `suspended`, and fires once resumed if it still holds",
    )
    targets: TargetSpec
    vars: dict[LabelName, str] = Field(default_factory=dict, description="constants for query templates")
    signals: list[Signal] = Field(min_length=1)
    conditions: list[Condition] = Field(min_length=1)
    limits: Limits = Field(default_factory=Limits)
    escalation: Escalation = Field(
        default_factory=Escalation,
        description="the incident's ladder when an action of this policy did not end the breach in time",
    )

    def action_deadline(self) -> float:
        """Seconds after its decision a mutating action may still start: `limits.actionDeadline`, else 3 intervals
        (controller/loop/preconditions.py)."""
        if self.limits.actionDeadline is not None and self.limits.actionDeadline > 0:
            return float(self.limits.actionDeadline)
        # At least a minute: a restarted pod takes tens of seconds, and a 1 s interval must not expire every action.
        return max(3 * float(self.interval), 60.0)

    @model_validator(mode="after")
    def _cross_references(self) -> Policy:
        if self.interval <= 0:
            raise PolicyReferenceError("interval must be positive", ("interval",))
        reserved = QUERY_BUILTINS | TEXT_VARIABLES
        if any(c.attribution is not None or c.choose is not None for c in self.conditions):
            reserved |= ATTRIBUTION_VARIABLES
        for section, names in (("targets", list(self.targets.match)), ("vars", list(self.vars))):
            for name in names:
                if name in reserved:
                    # The built-in would silently win over the author's value.
                    raise PolicyReferenceError(
                        f"{name!r} is a reserved template variable ({', '.join(sorted(reserved))})",
                        ("targets", "match", name) if section == "targets" else ("vars", name),
                    )
        signal_names = [s.name for s in self.signals]
        for index, name in enumerate(signal_names):
            if name in signal_names[:index]:
                raise PolicyReferenceError(
                    f"signal names must be unique; {name!r} is repeated", ("signals", index, "name")
                )
        condition_names = [c.name for c in self.conditions]
        for index, name in enumerate(condition_names):
            if name in condition_names[:index]:
                raise PolicyReferenceError(
                    f"condition names must be unique; {name!r} is repeated", ("conditions", index, "name")
                )
        query_vars = set(self.targets.match) | set(self.vars) | QUERY_BUILTINS
        for index, signal in enumerate(self.signals):
            unknown = sorted(set(variables_in(signal.query or "")) - query_vars)
            if unknown:
                raise PolicyReferenceError(
                    f"undefined template variable(s) {', '.join(unknown)}; "
                    f"expected one of {', '.join(sorted(query_vars))}",
                    ("signals", index, "query"),
                )
        for index, condition in enumerate(self.conditions):
            action_vars = self.action_variables(condition)
            if condition.signal not in signal_names:
                raise PolicyReferenceError(
                    f"undefined signal {condition.signal!r}; expected one of {', '.join(signal_names)}",
                    ("conditions", index, "signal"),
                )
            _check_attribution(self, index, condition, signal_names)
            located: list[tuple[tuple[str | int, ...], BaseModel]] = [
                *((("conditions", index, "actions", i), a) for i, a in enumerate(condition.actions)),
                *(
                    (("conditions", index, "choose", b, "actions", i), a)
                    for b, branch in enumerate(condition.choose or [])
                    for i, a in enumerate(branch.actions)
                ),
                *(
                    (("conditions", index, "recovery", "actions", i), a)
                    for i, a in enumerate(condition.recovery.actions)
                ),
            ]
            for where, action in located:
                if getattr(action, "type", None) == "restore" and "recovery" not in where:
                    # An undo has nothing to undo when the condition fires: it belongs to the recovery.
                    raise PolicyReferenceError(
                        "a `restore` action belongs in `recovery.actions`: it undoes what the firing actions changed",
                        (*where, "type"),
                    )
                for field_loc, text in _template_fields(action):
                    unknown = sorted(set(variables_in(text)) - action_vars)
                    if unknown:
                        raise PolicyReferenceError(
                            f"undefined template variable(s) {', '.join(unknown)}; "
                            f"expected one of {', '.join(sorted(action_vars))}",
                            (*where, *field_loc),
                        )
        return self

    def action_variables(self, condition: Condition | None = None) -> frozenset[str]:
        """Variables of action text; a condition with `attribution` or `choose` also gets the attribution ones."""
        names = frozenset(self.targets.groupBy) | set(self.targets.match) | set(self.vars) | TEXT_VARIABLES
        if condition is not None and (condition.attribution is not None or condition.choose is not None):
            names |= ATTRIBUTION_VARIABLES
        return names

    def signal(self, name: str) -> Signal:
        return next(s for s in self.signals if s.name == name)


def _check_attribution(policy: Policy, index: int, condition: Condition, signal_names: list[str]) -> None:
    """Branch guards name real signals, need `attribution` to ask about rollouts, and `otherwise` comes last."""
    if condition.attribution is not None:
        known = set(policy.targets.groupBy) | set(policy.targets.match)
        for position, label in enumerate(condition.attribution.labels):
            if label not in known:
                raise PolicyReferenceError(
                    f"attribution label {label!r} is not a target label; expected one of {', '.join(sorted(known))}",
                    ("conditions", index, "attribution", "labels", position),
                )
    branches = condition.choose or []
    names = [branch.name for branch in branches]
    for position, branch in enumerate(branches):
        where: tuple[str | int, ...] = ("conditions", index, "choose", position)
        if branch.name in names[:position]:
            raise PolicyReferenceError(f"branch names must be unique; {branch.name!r} is repeated", (*where, "name"))
        guard = branch.if_
        if guard is None:
            if position != len(branches) - 1:
                raise PolicyReferenceError(
                    f"branch {branch.name!r} has no `if` (otherwise) but is not the last branch; "
                    "the branches after it could never run",
                    where,
                )
            continue
        if guard.attributedToRollout is not None and condition.attribution is None:
            raise PolicyReferenceError(
                "`attributedToRollout` needs the condition's `attribution` (window and labels)",
                (*where, "if", "attributedToRollout"),
            )
        if guard.signal is not None and guard.signal not in signal_names:
            raise PolicyReferenceError(
                f"undefined signal {guard.signal!r}; expected one of {', '.join(signal_names)}",
                (*where, "if", "signal"),
            )


def _template_fields(action: BaseModel) -> list[tuple[tuple[str | int, ...], str]]:
    """(location, text) of every string the engine renders, list items included (e.g. annotate tags)."""
    found: list[tuple[tuple[str | int, ...], str]] = []
    for name, value in action:
        if name == "type":
            continue
        if isinstance(value, str):
            found.append(((name,), value))
        elif isinstance(value, list):
            found.extend(((name, i), item) for i, item in enumerate(value) if isinstance(item, str))
    return found


class _PolicySchemaGenerator(GenerateJsonSchema):
    """Pydantic's generator, corrected so the schema accepts exactly what policy authors write.

    Without this, defaults of durations and `for` are shown as the engine's values (300.0,
    {"count": 1, ...}) which the schema itself rejects, and label-name dict keys are only
    `patternProperties`, which still lets `bad-label` through.
    """

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        json_schema = super().default_schema(schema)
        default = schema.get("default")
        if isinstance(default, ForSpec):
            json_schema["default"] = _for_serialize(default)
        elif (
            any(branch.get("pattern") == DURATION_PATTERN for branch in json_schema.get("anyOf", []))
            and isinstance(default, (int, float))
            and not isinstance(default, bool)
        ):
            json_schema["default"] = format_duration(float(default))
        return json_schema

    def dict_schema(self, schema: core_schema.DictSchema) -> JsonSchemaValue:
        json_schema = super().dict_schema(schema)
        patterns = json_schema.get("patternProperties")
        if isinstance(patterns, dict) and len(patterns) == 1:
            ((pattern, values),) = patterns.items()
            del json_schema["patternProperties"]
            json_schema["propertyNames"] = {"pattern": pattern}
            json_schema["additionalProperties"] = values
        return json_schema


def policy_json_schema() -> dict[str, Any]:
    schema = Policy.model_json_schema(by_alias=True, schema_generator=_PolicySchemaGenerator)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://tailguard.io/schemas/policy-v1alpha1.json"
    schema["title"] = "tailguard Policy"
    return schema
