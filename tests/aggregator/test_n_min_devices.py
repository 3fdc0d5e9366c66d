"""n_min counts distinct valid devices, not envelopes (issue 20, item 4).

The reproduced attack: with n_min 10, a batch of one real report repeated ten times was accepted
(1 counted, 9 duplicates): duplicates, garbage of the right length or replays of counted reports
padded any batch past n_min, so the one real report hid among nobody. Each case below is refused
with FAILED_PRECONDITION and nothing of the batch is stored; with the operator's ReleaseBelowNMin
the same batch counts and the answer says it was below n_min.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from deniable.aggregator.handlers import AggregatorHandlers
from deniable.core.errors import FailedPrecondition
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:  # the kit fixture's type only
    from support.aggregator_kit import Kit

N_MIN = 10


async def _campaign(handlers: AggregatorHandlers, kit: Kit) -> pb.Campaign:
    return await handlers.create_campaign(kit.binary_request("floor", n_min=N_MIN))


async def _n(handlers: AggregatorHandlers) -> tuple[int, int]:
    answer = await handlers.query(pb.QueryRequest(campaign_id="floor"), binary=True)
    return answer.n, answer.rejected


async def test_one_report_repeated_ten_times_is_refused(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await _campaign(handlers, kit)
    report = kit.seal(campaign, 1).report
    with pytest.raises(FailedPrecondition, match=r"1 distinct valid devices, below n_min \(10\)"):
        await handlers.ingest_batch(kit.batch_of("floor", [report] * N_MIN))
    assert await _n(handlers) == (0, 0)  # nothing counted, not even the rejections


async def test_garbage_of_the_right_length_does_not_pad_a_batch(
    handlers: AggregatorHandlers, kit: Kit
) -> None:
    campaign = await _campaign(handlers, kit)
    real = [kit.seal(campaign, 1).report for _ in range(3)]
    garbage = [
        pb.EncryptedReport(
            campaign_id="floor", key_id=campaign.key_id, ciphertext=bytes(campaign.ciphertext_length)
        )
        for _ in range(N_MIN)
    ]
    with pytest.raises(FailedPrecondition, match="3 distinct valid devices"):
        await handlers.ingest_batch(kit.batch_of("floor", real + garbage))
    assert await _n(handlers) == (0, 0)


async def test_replays_of_counted_reports_do_not_pad_a_batch(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await _campaign(handlers, kit)
    first = [kit.seal(campaign, 1).report for _ in range(N_MIN)]
    assert (await handlers.ingest_batch(kit.batch_of("floor", first))).devices == N_MIN
    replay = [*first[:9], kit.seal(campaign, 0).report]  # nine replays and one new device
    with pytest.raises(FailedPrecondition, match="1 distinct valid devices"):
        await handlers.ingest_batch(kit.batch_of("floor", replay))
    assert await _n(handlers) == (N_MIN, 0)


async def test_enough_distinct_devices_count_with_their_rejections(
    handlers: AggregatorHandlers, kit: Kit
) -> None:
    campaign = await _campaign(handlers, kit)
    reports = [kit.seal(campaign, 1).report for _ in range(N_MIN)]
    response = await handlers.ingest_batch(kit.batch_of("floor", [*reports, reports[0]]))
    assert (response.counted, response.devices, response.below_n_min) == (N_MIN, N_MIN, False)
    assert kit.rejected_map(response) == {pb.DUPLICATE_REPORT: 1}


async def test_the_operator_may_release_below_n_min_and_the_answer_says_so(
    handlers: AggregatorHandlers, kit: Kit
) -> None:
    campaign = await _campaign(handlers, kit)
    report = kit.seal(campaign, 1).report
    await handlers.release_below_n_min(pb.ReleaseBelowNMinRequest(campaign_id="floor", valid_s=60))
    response = await handlers.ingest_batch(kit.batch_of("floor", [report] * N_MIN))
    assert (response.counted, response.devices, response.below_n_min) == (1, 1, True)
    assert await _n(handlers) == (1, N_MIN - 1)
