"""A rollout in the SDK's style: one LLM call through the openai package, traced."""

from dashscope.finetune.reinforcement import (
    AbstractRolloutProcessor,
    AgentOutput,
    RolloutInput,
    RolloutOutput,
    TaskStatus,
)
from dashscope.finetune.reinforcement.component.observability import observe_processor, trace_client
from openai import AsyncOpenAI


class OneShotRollout(AbstractRolloutProcessor):
    @observe_processor
    async def process(self, input_data: RolloutInput) -> RolloutOutput:
        resource = input_data.model_resource
        client = AsyncOpenAI(
            base_url=resource.base_url, api_key=resource.api_key.get_secret_value()
        )
        trace_client(client)  # instruments the client in place, as the SDK's does
        response = await client.chat.completions.create(
            model=resource.model_name, messages=input_data.messages
        )
        message = response.choices[0].message.model_dump(exclude_none=True)
        return RolloutOutput(
            agent_output=AgentOutput(
                messages=[*input_data.messages, message], rollout_metrics={"turns": 1.0}
            ),
            status=TaskStatus.SUCCESS,
        )
