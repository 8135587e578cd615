"""The continuous auditor's share of the time: after each step it pauses long enough
that its steps take at most `audit_max_share` of the time, however large the deployment
is for its interval (timewheel/audit/continuous.py, share_pause)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from prometheus_client import CollectorRegistry

from timewheel.audit.continuous import ContinuousAuditor, share_pause
from timewheel.dispatch.metrics import AuditorMetrics
from timewheel.engine import Engine
from timewheel.tasks.model import NewTask


def test_the_pause_makes_the_steps_that_share_of_the_time() -> None:
    for step_s, share in ((0.01, 0.03), (0.004, 0.5), (0.2, 1.0)):
        pause = share_pause(step_s, share)
        assert abs(step_s / (step_s + pause) - share) < 1e-9
    assert share_pause(-1.0, 0.1) == 0.0


async def test_steps_of_a_pass_too_large_for_its_interval_keep_to_the_share(
    engine: Engine,
) -> None:
    await engine.tasks.create_many(
        [NewTask(f"t{i % 7}", delay_ms=3_600_000 + i) for i in range(1_200)]
    )
    auditor = ContinuousAuditor(
        engine.store, "node-a", 2_000, AuditorMetrics(CollectorRegistry()), lambda: ["node-a"]
    )
    # A 1 ms interval: the pacing by interval alone would pause the least it can.
    auditor.settings = dataclasses.replace(
        engine.settings, audit_interval_ms=1, audit_step_budget=100, audit_max_share=0.05
    )
    steps = 0
    while True:
        began = time.monotonic()
        await auditor._step()
        took = time.monotonic() - began
        steps += 1
        if auditor.current is None:
            break
        # The pause is 19 times what the step took (5 %), and the wait keeps to it.
        assert 0 < auditor._floor_s <= share_pause(took, 0.05)
        assert auditor._wait_s() > 0
        # Woken early (a canary poll, a lease round), it does not step before the pause.
        if auditor._wait_s() > 0.05:
            calls = auditor.current.examined.calls
            await auditor._step()
            assert auditor.current.examined.calls == calls
        await asyncio.sleep(auditor._wait_s())
        assert steps < 10_000
    assert steps > 3  # the pass took several steps, each paced
    assert auditor.passes == 1
