"""The reward registry: sub-rewards, weights, aggregation, failures and inheritance."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import re
import threading
import time

import anyio
import pytest

from processors_base import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
    aggregate_func,
    reward_func,
    sub_reward_func,
)
from processors_base.dispatch import Services, runtime_services
from processors_base.rewards import InvalidSubRewardOutput, SubRewardErrors, registry_of

INPUT = RewardInput(agent_output={"messages": [{"role": "assistant", "content": "42"}]})


def out(score: float, **metrics: float) -> RewardOutput:
    return RewardOutput(reward=Reward(reward_score=score, reward_metrics=metrics or None))


@reward_func("weighted")
class Weighted(AbstractRewardProcessor):
    def __init__(self) -> None:
        self.threads: dict[str, str] = {}

    @sub_reward_func("a", sub_weight=0.25)
    def sub_a(self, input_data: RewardInput) -> RewardOutput:
        self.threads["a"] = threading.current_thread().name
        return out(1.0, hits=2)

    @sub_reward_func(sub_weight=0.75)
    async def sub_b(self, input_data: RewardInput) -> RewardOutput:
        return out(0.5)


_LENT: dict[int, SubRewardErrors] = {}  # processor id -> what a runtime would lend it


def lend(processor: AbstractRewardProcessor, errors: SubRewardErrors) -> SubRewardErrors:
    """Run ``processor`` (in ``run``) with ``errors`` as a runtime lends them, through
    ``dispatch.runtime_services``, never as an attribute of the processor."""
    _LENT[id(processor)] = errors
    return errors


def run(processor: AbstractRewardProcessor) -> RewardOutput:
    errors = _LENT.get(id(processor))
    token = runtime_services.set(Services(sub_reward_errors=errors)) if errors else None
    try:
        return anyio.run(processor.process, INPUT)
    finally:
        if token is not None:
            runtime_services.reset(token)


def test_default_aggregate_is_the_weighted_sum_with_metrics():
    processor = Weighted()
    result = run(processor)
    assert result.status is TaskStatus.SUCCESS
    assert result.reward.reward_score == pytest.approx(0.25 * 1.0 + 0.75 * 0.5)
    assert result.reward.reward_metrics == {"a": 1.0, "sub_b": 0.5, "a.hits": 2.0}
    assert processor.threads["a"] != threading.main_thread().name  # sync ran off the loop


def test_helpers():
    processor = Weighted()
    subs = {"a": out(1.0, x=3), "sub_b": out(0.0)}
    assert processor.get_weights() == {"a": 0.25, "sub_b": 0.75}
    assert processor.get_scores(subs) == {"a": 1.0, "sub_b": 0.0}
    assert processor.get_total(subs) == 0.25
    assert processor.get_reward_metrics(subs) == {"a.x": 3.0}
    with pytest.raises(ValueError, match="'nope'"):
        processor.get_total({"nope": out(1.0)})


@reward_func("failing")
class Failing(AbstractRewardProcessor):
    @sub_reward_func("bad", sub_weight=1.0)
    def bad(self, input_data: RewardInput) -> RewardOutput:
        raise RuntimeError("sandbox down")

    @sub_reward_func("good", sub_weight=2.0)
    async def good(self, input_data: RewardInput) -> RewardOutput:
        return out(1.0)

    @aggregate_func
    async def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
        self.seen = sub_rewards
        return out(self.get_total(sub_rewards), failed=float(sub_rewards["bad"].status == "failed"))


def test_a_failing_sub_reward_does_not_sink_the_others():
    processor = Failing()
    result = run(processor)
    bad = processor.seen["bad"]
    assert bad.status is TaskStatus.FAILED and bad.reward.reward_score == 0.0
    assert "sandbox down" in bad.error
    assert processor.seen["good"].status is TaskStatus.SUCCESS
    assert result.reward.reward_score == 2.0
    assert result.reward.reward_metrics == {"failed": 1.0}


# The sub-rewards of Concurrent wait for each other: run one after another, they fail.
SYNC_TOGETHER = threading.Barrier(2, timeout=10)  # both sync ones inside at once
ASYNC_RAN = threading.Event()  # the async one ran while they were
TICKS = [0]  # the event loop's ticks, counted by the test


def sync_part() -> RewardOutput:
    SYNC_TOGETHER.wait()  # BrokenBarrierError unless the other runs at the same time
    assert ASYNC_RAN.wait(10), "the async sub-reward did not run meanwhile"
    seen, deadline = TICKS[0], time.monotonic() + 10
    while TICKS[0] < seen + 3:  # the loop goes on ticking while this thread works
        assert time.monotonic() < deadline, "the event loop was held"
        time.sleep(0.01)
    return out(1.0)


@reward_func("concurrent")
class Concurrent(AbstractRewardProcessor):
    @sub_reward_func("s1")
    def s1(self, input_data: RewardInput) -> RewardOutput:
        return sync_part()

    @sub_reward_func("s2")
    def s2(self, input_data: RewardInput) -> RewardOutput:
        return sync_part()

    @sub_reward_func("a1")
    async def a1(self, input_data: RewardInput) -> RewardOutput:
        ASYNC_RAN.set()
        return out(1.0)

    @aggregate_func
    def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
        return out(sum(r.reward.reward_score for r in sub_rewards.values()))


def test_sub_rewards_run_concurrently_and_the_loop_stays_free():
    ASYNC_RAN.clear()

    async def main() -> RewardOutput:
        async def tick() -> None:
            while True:
                TICKS[0] += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        try:
            return await Concurrent().process(INPUT)
        finally:
            ticker.cancel()

    result = anyio.run(main)
    # each sub-reward scored: all three ran together, and the sync ones never held the loop
    assert result.reward.reward_score == 3.0, result


def test_subclass_inherits_and_extends_sub_rewards():
    class More(Weighted):
        @sub_reward_func("c", sub_weight=2.0)
        def sub_c(self, input_data: RewardInput) -> RewardOutput:
            return out(1.0)

    assert More().get_weights() == {"a": 0.25, "sub_b": 0.75, "c": 2.0}
    assert Weighted().get_weights() == {"a": 0.25, "sub_b": 0.75}
    assert run(More()).reward.reward_score == pytest.approx(0.625 + 2.0)


def test_instances_share_no_mutable_state():
    first, second = Weighted(), Weighted()
    first.get_weights()["a"] = 100.0
    assert second.get_weights()["a"] == 0.25
    run(first)
    assert second.threads == {}


def test_sub_rewards_may_return_plain_numbers_or_dicts():
    @reward_func("loose")
    class Loose(AbstractRewardProcessor):
        @sub_reward_func("n")
        def number(self, input_data: RewardInput) -> float:
            return 0.5

        @sub_reward_func("d")
        def mapping(self, input_data: RewardInput) -> dict:
            return {"reward": {"reward_score": 0.25}}

    result = run(Loose())
    assert result.reward.reward_metrics == {"n": 0.5, "d": 0.25}
    assert result.reward.reward_score == 0.75


@pytest.mark.parametrize("returned", [None, "high", True, {"reward": "x"}])
def test_a_sub_reward_returning_no_reward_fails_the_request(returned: object) -> None:
    # The SDK's server answers such a request 500; scoring it 0 would train on a bug.
    @reward_func("wrong")
    class Wrong(AbstractRewardProcessor):
        @sub_reward_func("fine")
        def fine(self, input_data: RewardInput) -> RewardOutput:
            return out(1.0)

        @sub_reward_func("x")
        def wrong(self, input_data: RewardInput) -> object:
            return returned

    with pytest.raises(InvalidSubRewardOutput, match="sub-reward 'x' returned"):
        run(Wrong())


def test_decorator_misuse_is_reported():
    with pytest.raises(TypeError, match="AbstractRewardProcessor"):

        @reward_func("plain")
        class Plain:
            pass


def test_two_sub_rewards_of_one_name_the_later_in_name_order_wins() -> None:
    # As the SDK collects them (sorted attribute names): no error, "two" replaces "one",
    # and the name keeps the place "one" gave it.
    @reward_func("dup")
    class Dup(AbstractRewardProcessor):
        @sub_reward_func("same", sub_weight=10.0)
        def two(self, input_data: RewardInput) -> RewardOutput:
            return out(2.0)

        @sub_reward_func("same")
        def one(self, input_data: RewardInput) -> RewardOutput:
            return out(1.0)

        @sub_reward_func("other")
        def other(self, input_data: RewardInput) -> RewardOutput:
            return out(0.0)

    assert list(Dup().get_weights().items()) == [("same", 10.0), ("other", 1.0)]
    assert run(Dup()).reward.reward_score == 20.0


def test_undecorated_subclass_without_process_is_abstract():
    class Forgot(AbstractRewardProcessor):
        pass

    with pytest.raises(TypeError):
        Forgot()


# --- failures are visible; overrides follow attribute lookup; the decorator wins ---------


@reward_func("judged")
class Judged(AbstractRewardProcessor):
    @sub_reward_func("format", sub_weight=0.2)
    def format_ok(self, input_data: RewardInput) -> RewardOutput:
        return out(1.0)

    @sub_reward_func("judge", sub_weight=0.8)
    async def judge(self, input_data: RewardInput) -> RewardOutput:
        raise ConnectionError("judge timed out")


def test_a_failed_sub_reward_is_marked_logged_once_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []
    processor = Judged()
    lend(processor, SubRewardErrors(on_failure=seen.append))
    with caplog.at_level(logging.ERROR):
        results = [run(processor) for _ in range(3)]
    for result in results:
        assert result.status is TaskStatus.SUCCESS  # the SDK's semantics: it scores 0
        assert result.reward.reward_score == pytest.approx(0.2)
        assert result.reward.reward_metrics == {"format": 1.0, "judge": 0.0, "judge.failed": 1.0}
    assert seen == ["judge", "judge", "judge"]
    logged = [r for r in caplog.records if "judge" in r.getMessage()]
    assert len(logged) == 1  # rate-limited per sub-reward name
    assert logged[0].levelno == logging.ERROR and logged[0].exc_info is not None
    assert "sub-reward 'judge' of Judged failed" in logged[0].getMessage()


def test_without_a_runtime_a_failed_sub_reward_is_still_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR):
        result = run(Judged())
    assert result.reward.reward_metrics["judge.failed"] == 1.0
    assert any("judge timed out" in r.getMessage() for r in caplog.records)


def test_fail_mode_fails_the_result_naming_each_failed_sub_reward() -> None:
    @reward_func("two_broken")
    class TwoBroken(Judged):
        @sub_reward_func("sandbox")
        def sandbox(self, input_data: RewardInput) -> RewardOutput:
            raise OSError("sandbox unreachable")

        @aggregate_func
        def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
            raise AssertionError("the aggregate would only see fake zeros")

    processor = TwoBroken()
    lend(processor, SubRewardErrors(mode="fail"))
    result = run(processor)
    assert result.status is TaskStatus.FAILED
    assert result.error_code == "SUB_REWARD_ERROR"
    assert "'judge'" in result.error and "judge timed out" in result.error
    assert "'sandbox'" in result.error and "sandbox unreachable" in result.error
    assert "'format'" not in result.error


def test_an_unknown_sub_reward_errors_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="zero, fail or renormalize"):
        SubRewardErrors(mode="ignore")


def test_the_decorator_wins_over_a_placeholder_process() -> None:
    @reward_func("placeholder")
    class Placeholder(AbstractRewardProcessor):
        @sub_reward_func("answer", sub_weight=0.8)
        def answer(self, input_data: RewardInput) -> RewardOutput:
            return out(1.0)

        def process(self, input_data: RewardInput) -> RewardOutput:
            return out(0.0)

    assert run(Placeholder()).reward.reward_score == pytest.approx(0.8)


@reward_func("base")
class Base(AbstractRewardProcessor):
    @sub_reward_func("a")
    def a(self, input_data: RewardInput) -> RewardOutput:
        return out(1.0)

    @sub_reward_func("b")
    def b(self, input_data: RewardInput) -> RewardOutput:
        return out(0.5)

    @aggregate_func
    def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
        return out(self.get_total(sub_rewards))


def test_an_undecorated_override_of_the_aggregate_is_no_aggregate() -> None:
    # As attribute lookup finds it (and the SDK collects it): the override has no tag.
    class Override(Base):
        async def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:  # type: ignore[override]
            return out(10 * self.get_total(sub_rewards))

    result = run(Override())
    assert isinstance(result, RewardOutput)
    assert result.reward.reward_score == 1.5
    assert result.reward.reward_metrics == {"a": 1.0, "b": 0.5}  # the default weighted sum


def test_a_decorated_async_override_of_a_sync_aggregate_is_awaited() -> None:
    class Override(Base):
        @aggregate_func
        async def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:  # type: ignore[override]
            await asyncio.sleep(0)
            return out(10 * self.get_total(sub_rewards))

    assert run(Override()).reward.reward_score == 15.0


def test_assigning_none_unregisters_a_sub_reward_or_the_aggregate() -> None:
    class WithoutB(Base):
        b = None

    class WithoutAggregate(Base):
        combine = None

    assert WithoutB().get_weights() == {"a": 1.0}
    assert run(WithoutB()).reward.reward_score == 1.0
    result = run(WithoutAggregate())
    assert result.reward.reward_score == 1.5
    assert result.reward.reward_metrics == {"a": 1.0, "b": 0.5}  # the default weighted sum


def test_an_undecorated_override_of_a_sub_reward_is_no_sub_reward() -> None:
    class Stricter(Weighted):
        def sub_a(self, input_data: RewardInput) -> RewardOutput:
            return out(0.0)

    assert Stricter().get_weights() == {"sub_b": 0.75}
    assert run(Stricter()).reward.reward_metrics == {"sub_b": 0.5}


def test_a_sync_sub_reward_behind_an_async_wrapper_is_awaited() -> None:
    def retrying(func):  # type: ignore[no-untyped-def]
        @functools.wraps(func)
        async def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            return func(*args, **kwargs)

        return wrapper

    def to_thread(func):  # type: ignore[no-untyped-def]
        @functools.wraps(func)
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            # a sync def that returns a coroutine
            return asyncio.sleep(0, result=func(*args, **kwargs))

        return wrapper

    @reward_func("wrapped")
    class Wrapped(AbstractRewardProcessor):
        @sub_reward_func("w")
        @retrying
        def w(self, input_data: RewardInput) -> RewardOutput:
            return out(1.0)

        @sub_reward_func("t")
        @to_thread
        def t(self, input_data: RewardInput) -> RewardOutput:
            return out(1.0)

    result = run(Wrapped())
    assert result.reward.reward_metrics == {"w": 1.0, "t": 1.0}
    assert result.reward.reward_score == 2.0


def test_processor_id_and_no_sub_rewards_as_the_sdk_accepts() -> None:
    @reward_func(processor_id="empty")
    class Empty(AbstractRewardProcessor):
        pass

    assert registry_of(Empty).processor_id == "empty"
    result = run(Empty())
    assert result.status is TaskStatus.SUCCESS
    assert result.reward.reward_score == 0.0 and result.reward.reward_metrics is None


def test_reward_processors_have_a_working_executor() -> None:
    @reward_func("offloading")
    class Offloading(AbstractRewardProcessor):
        @sub_reward_func("o")
        async def o(self, input_data: RewardInput) -> RewardOutput:
            loop = asyncio.get_running_loop()
            name = await loop.run_in_executor(self.executor, lambda: threading.current_thread())
            return out(float(name is not threading.main_thread()))

    processor = Offloading()
    assert run(processor).reward.reward_score == 1.0
    assert isinstance(processor.executor, concurrent.futures.Executor)
    executor = processor.executor
    processor.shutdown()
    with pytest.raises(RuntimeError):
        executor.submit(int)
    assert processor.executor is None  # as the SDK's reads after shutdown()
    mine = concurrent.futures.ThreadPoolExecutor(1)
    given = Offloading(executor=mine)
    assert given.executor is mine
    given.close_executor()  # not ours to shut down
    assert mine.submit(int).result() == 0
    mine.shutdown()


def test_the_failures_left_out_are_counted_when_their_window_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    processor = Judged()
    errors = lend(processor, SubRewardErrors(log_every=60.0))
    with caplog.at_level(logging.ERROR):
        for _ in range(4):
            run(processor)
        errors.flush()  # as at shutdown; a timer does it when the window ends
        errors.flush()  # once only
        run(processor)  # a new window: logged at once
    logged = [r.getMessage() for r in caplog.records if "'judge'" in r.getMessage()]
    assert len(logged) == 3, logged
    assert logged[0].startswith("sub-reward 'judge' of Judged failed")
    assert re.fullmatch(r".*: 3 more failures in the [\d.]+s after the one logged.*", logged[1])
    assert logged[2].startswith("sub-reward 'judge' of Judged failed")


def test_reward_func_used_bare_takes_the_class_name() -> None:
    @reward_func
    class Bare(AbstractRewardProcessor):
        @sub_reward_func
        def only(self, input_data: RewardInput) -> RewardOutput:
            return out(0.5)

    assert registry_of(Bare).processor_id == "Bare"
    assert run(Bare()).reward.reward_score == 0.5


def test_a_sub_reward_that_returns_status_failed_counts_as_failed() -> None:
    @reward_func("says_failed")
    class SaysFailed(AbstractRewardProcessor):
        @sub_reward_func("s")
        def s(self, input_data: RewardInput) -> RewardOutput:
            return RewardOutput(
                reward=Reward(reward_score=0.5), status=TaskStatus.FAILED, error="no judge"
            )

    seen: list[str] = []
    zero = SaysFailed()
    lend(zero, SubRewardErrors(on_failure=seen.append))
    result = run(zero)
    assert result.status is TaskStatus.SUCCESS and result.reward.reward_score == 0.5
    assert result.reward.reward_metrics == {"s": 0.5, "s.failed": 1.0}
    assert seen == ["s"]
    fail = SaysFailed()
    lend(fail, SubRewardErrors(mode="fail"))
    result = run(fail)
    assert result.status is TaskStatus.FAILED
    assert result.error == "sub-reward 's' returned status failed: no judge"


def test_two_aggregates_the_later_in_name_order_wins() -> None:
    # The SDK collects every tagged method in sorted name order; the last one is used.
    @reward_func("two_aggregates")
    class TwoAggregates(Base):
        @aggregate_func
        def z_last(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
            return out(7.0)

    assert registry_of(TwoAggregates).aggregate == "z_last"
    assert run(TwoAggregates()).reward.reward_score == 7.0


def renormalizing(processor: AbstractRewardProcessor) -> AbstractRewardProcessor:
    lend(processor, SubRewardErrors(mode="renormalize"))
    return processor


@reward_func("three_judges")
class ThreeJudges(AbstractRewardProcessor):
    """Weights 0.5, 0.3 and -0.2 (a penalty); each fails when its name is in ``FAILING``."""

    failing: frozenset[str] = frozenset()

    def _score(self, name: str, score: float) -> RewardOutput:
        if name in self.failing:
            raise TimeoutError(f"{name} timed out")
        return out(score)

    @sub_reward_func("a", sub_weight=0.5)
    def a(self, input_data: RewardInput) -> RewardOutput:
        return self._score("a", 1.0)

    @sub_reward_func("b", sub_weight=0.3)
    def b(self, input_data: RewardInput) -> RewardOutput:
        return self._score("b", 0.5)

    @sub_reward_func("penalty", sub_weight=-0.2)
    def penalty(self, input_data: RewardInput) -> RewardOutput:
        return self._score("penalty", 1.0)


def three(*failing: str) -> RewardOutput:
    processor = renormalizing(ThreeJudges())
    processor.failing = frozenset(failing)
    return run(processor)


def test_renormalize_leaves_a_failed_sub_reward_out_and_scales_the_others() -> None:
    whole = 0.5 + 0.3 - 0.2
    assert three().reward.reward_score == pytest.approx(0.5 * 1.0 + 0.3 * 0.5 - 0.2)
    assert "renormalized" not in three().reward.reward_metrics  # nothing failed: unmarked
    result = three("b")  # 0.5 and -0.2 left, scaled to sum to 0.6 again
    assert result.status is TaskStatus.SUCCESS
    assert result.reward.reward_score == pytest.approx((0.5 * 1.0 - 0.2 * 1.0) * whole / 0.3)
    assert result.reward.reward_metrics == {
        "a": 1.0,
        "b": 0.0,
        "penalty": 1.0,
        "b.failed": 1.0,
        "renormalized": 1.0,
    }


def test_renormalize_with_nothing_left_to_carry_the_weight_is_a_failure() -> None:
    for failing in (("a", "b", "penalty"), ("a", "b")):  # all, or only the penalty left
        result = three(*failing)
        assert result.status is TaskStatus.FAILED, failing
        assert result.error_code == "SUB_REWARD_ERROR"
        assert "no sub-reward that succeeded carries weight to renormalise" in result.error
        assert "a timed out" in result.error


def test_renormalize_leaves_out_a_sub_reward_that_says_it_failed() -> None:
    @reward_func("says_failed_twice")
    class SaysFailed(AbstractRewardProcessor):
        @sub_reward_func("ok", sub_weight=0.25)
        def ok(self, input_data: RewardInput) -> RewardOutput:
            return out(0.8)

        @sub_reward_func("unsure", sub_weight=0.75)
        def unsure(self, input_data: RewardInput) -> RewardOutput:
            return RewardOutput(reward=Reward(reward_score=1.0), status=TaskStatus.FAILED)

    result = run(renormalizing(SaysFailed()))
    assert result.reward.reward_score == pytest.approx(0.8)  # its own 1.0 is not counted
    assert result.reward.reward_metrics["unsure.failed"] == 1.0


def test_with_an_aggregate_renormalize_lets_it_decide() -> None:
    @reward_func("judged_aggregate")
    class JudgedAggregate(Judged):
        @aggregate_func
        def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
            return out(self.get_total(sub_rewards), seen=float(len(sub_rewards)))

    @reward_func("all_failed_aggregate")
    class AllFailed(JudgedAggregate):
        @sub_reward_func("format", sub_weight=0.2)
        def format_ok(self, input_data: RewardInput) -> RewardOutput:
            raise ValueError("no format")

    result = run(renormalizing(JudgedAggregate()))
    assert result.status is TaskStatus.SUCCESS
    assert result.reward.reward_score == pytest.approx(0.2)  # it saw the failed one, as zero
    assert result.reward.reward_metrics == {"seen": 2.0}
    assert run(renormalizing(AllFailed())).status is TaskStatus.FAILED  # nothing to decide on
