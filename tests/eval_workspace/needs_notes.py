"""Reads a Markdown file at import: it works in the workspace, but *.md files are not
packaged, so it cannot start from the package that would ship."""

from __future__ import annotations

from pathlib import Path

from processors_base import AbstractRewardProcessor, Reward, RewardInput, RewardOutput

NOTES = (Path(__file__).parent / "notes.md").read_text()


class NeedsNotes(AbstractRewardProcessor):
    async def process(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=float(len(NOTES) > 0)))
