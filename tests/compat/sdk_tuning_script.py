"""A Tuning script as the DashScope SDK's documentation writes them, unchanged: it imports
only the SDK's names. tests/compat/test_sdk_tuning.py runs it, with the SDK absent, in a
copy of sample_functions/ against the stand-in platform
(``python -m runtime.compat sdk_tuning_script.py``), and checks what it prints."""

import asyncio
import os

from dashscope.finetune.agentic_rl import (
    AgenticRL,
    AgenticRLFunctionComponent,
    FunctionType,
    RewardFunctionComponent,
    TrainingDataset,
    ValidationDataset,
)
from dashscope.finetune.reinforcement import (  # where SDK 2.0.2 has them
    DataSourceType,
    FunctionComponentModel,
    FunctionComponentRuntime,
)


async def main() -> None:
    rl = AgenticRL(api_key=os.environ["TUNING_KEY"]).init("rl-job.yaml", job_name="custom_job")

    reward = RewardFunctionComponent(  # AgenticRLFunctionComponent has no weight in the SDK
        type=FunctionType.REWARD,
        name="answer-match",
        weight=1.0,
        fcmodel=FunctionComponentModel(
            zipdir="./", classpath="functions.reward.reward.DemoRewardProcessor"
        ),
        runtime=FunctionComponentRuntime(cpu=1.0, memory_size=2048),
    )
    rollout = AgenticRLFunctionComponent(
        type=FunctionType.ROLLOUT,
        name="calc-rollout",
        fcmodel=FunctionComponentModel(
            classpath="functions/rollout/rollout.py:DemoRolloutProcessor"
        ),
    )
    # the reward started now, to test it; then both registered (the reward is reused)
    ids = await rl.register_functions(functions=[reward], lazy_load=False)
    print("instance", ids[4][0].startswith("rw-ins-"))
    with open("requests/reward.json") as f:
        import json

        sample = json.load(f)
    output = await AgenticRL.test_functions(
        ids[4][0], functype=FunctionType.REWARD, input_data=sample
    )
    print("tested", output.status, output.reward.reward_score)

    ids = await rl.register_functions(functions=[rollout, reward], lazy_load=True)
    print("ids", [len(group) for group in ids], ids[1][0] == reward.entity_id)

    training, validation = await rl.upload_datasets(
        training_files=["data/calc_train.jsonl"], validation_files=["data/calc_validation.jsonl"]
    )
    print("files", len(training), len(validation), training[0].startswith("file-"))

    job = rl.submit_job(model="qwen3.5-9b", hyper_parameters={"n_epochs": 2})
    print("submitted", job.status_code, job.output.status, job.output["job_name"][:11])
    job_id = job.output.job_id

    print("get", AgenticRL.get(job_id).output.status)
    listed = AgenticRL.list(page_no=1, page_size=10)
    print("list", listed.output.total, [j.job_id for j in listed.output.jobs] == [job_id])
    print("logs", AgenticRL.logs(job_id, offset=1, lines=1).output.logs)
    print("cancel", AgenticRL.cancel(job_id).output.status)
    print("delete", AgenticRL.delete(job_id).output.status)
    missing = AgenticRL.get(job_id)
    print("missing", missing.status_code, missing.code, missing["output"])

    # run(): register (the components keep their ids), upload, submit in one call
    second = (
        await AgenticRL(api_key=os.environ["TUNING_KEY"])
        .init("rl-job.yaml")
        .run(
            model="qwen3.5-9b",
            training_datasets=[
                TrainingDataset(
                    data_source_type=DataSourceType.FILE_ID, file_name="./data/calc_train.jsonl"
                )
            ],
            validation_datasets=[ValidationDataset(file_name="./data/calc_validation.jsonl")],
            functions=[rollout, reward],
            job_name="in-one-go",
        )
    )
    print("run", second.status_code, second.output.status, second.output.job_name[:9])


asyncio.run(main())
