"""``SupervisorConformance``: the conformance kit as a hypothesis state machine, tick by tick."""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from .._core._spec import DEFAULT_SPEC
from ._agent_shape import (
    HarnessError,
)
from ._check_script import ConformanceFailure, check_script
from ._oracle import _oracle, _profile
from ._reference import (
    ConformanceTrace,
    Pending,
)
from ._scripted import _HarnessAbort
from ._strategies import (
    RunConfig,
    Tick,
)
from ._targets import _DEFAULTS, _spec_label, resolve_target


def _class_attr(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in vars(klass):
            value = vars(klass)[name]
            return value.__func__ if isinstance(value, staticmethod) else value
    return None


class SupervisorConformance(RuleBasedStateMachine):
    """Base state machine: subclass it, set ``target`` and ``spec``, and run its ``TestCase``.

    Each hypothesis step either starts a new run (settings drawn by :func:`run_configs`) or adds
    one monitor tick to the current run's script (:func:`ticks`); after every step the target is
    run on the whole script so far and compared with the reference, call by call. Add your own
    ``@rule``/``@invariant`` methods in the subclass; ``self.config``, ``self.script`` and
    ``self.last`` (the target's latest :class:`ConformanceTrace`) are there to read.

    >>> class TestMyAgent(SupervisorConformance):  # doctest: +SKIP
    ...     target = MyAgent          # a SimpleElasticAgent subclass, or a factory(driver)
    ...     spec = "torchrun"
    >>> TestMyAgentCase = TestMyAgent.TestCase     # doctest: +SKIP
    """

    target: ClassVar[Any] = None
    spec: ClassVar[Any] = DEFAULT_SPEC
    #: run_conformance's machines stop hypothesis at once on a HarnessError (nothing to shrink).
    _abort_on_harness_error: ClassVar[bool] = False
    #: Parameter values every run uses (run_conformance's ``params``).
    _fixed_params: ClassVar[tuple[tuple[str, Any], ...]] = ()

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        target = _class_attr(cls, "target")
        if target is None:
            raise TypeError(f"{cls.__name__}.target is not set: give it a SimpleElasticAgent "
                            "subclass or a factory(driver) -> supervisor")
        spec = _class_attr(cls, "spec")
        self._target = resolve_target(target, spec)
        self._expected = _oracle(spec)
        profile = _profile(spec, cls._fixed_params)
        self._configs = profile.configs.map(self._target.project)
        self._ticks = profile.ticks()
        self._window = profile.window
        self.config: RunConfig = _DEFAULTS
        self.script: list[Tick] = []
        self.last: ConformanceTrace | None = None
        self.running = False
        self._saved_disable = logging.root.manager.disable
        logging.disable(logging.CRITICAL)

    def _verify(self, expected: ConformanceTrace) -> None:
        try:
            self.last = check_script(self._target, self.config, self.script, expected=expected,
                                     spec_label=_spec_label(type(self).spec),
                                     windowed=self._window(self.config) < math.inf)
        except HarnessError as e:
            if type(self)._abort_on_harness_error:
                raise _HarnessAbort(e) from None
            raise

    def _advance(self) -> None:
        # The target runs once per run, when the reference says the run is over (or at
        # teardown): replaying it after every tick would make shrinking quadratic.
        expected = self._expected(self.config, self.script)
        self.running = isinstance(expected.outcome, Pending)
        if not self.running:
            self._verify(expected)

    # The strategies depend on the spec (its parameters, whether it is timed): each run's
    # settings and each tick are drawn from the machine's own.
    @precondition(lambda self: not self.running)
    @rule(data=st.data())
    def start_run(self, data: st.DataObject) -> None:
        """Start a fresh supervisor with settings drawn for the spec."""
        config = data.draw(self._configs, label="config")
        self.config = self._target.project(config)
        self.script = []
        self.last = None
        self._advance()

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def tick(self, data: st.DataObject) -> None:
        """The next monitor call returns what a tick drawn for the spec says."""
        self.script.append(data.draw(self._ticks, label="tick"))
        self._advance()

    def teardown(self) -> None:
        """Check the run still in progress (the target must still be asking for ticks)."""
        try:
            if self.running:
                self._verify(self._expected(self.config, self.script))
        finally:
            logging.disable(self._saved_disable)

    @invariant()
    def restarts_within_bounds(self) -> None:
        """Remaining restarts never leave 0..max_restarts."""
        last = self.last
        if last is not None and last.remaining_restarts is not None and not (
                0 <= last.remaining_restarts <= self.config.max_restarts):
            raise ConformanceFailure(
                f"{self._target.name}: remaining_restarts={last.remaining_restarts} outside "
                f"0..{self.config.max_restarts}")


