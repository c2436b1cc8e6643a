"""What train.py and eval.py run on; none of it is the paper's, and a reader of Algorithm 1 may
skip this folder. train.py's ALGO blocks reach into it at these seams only: the loop's steps and
pools (`run.steps`, `baseline.Schedule`), the sampling handed to the designer, the hints and the
agent (`run.sampler`), the collective behind the designer's advantages and the memory
(`run.gather`), the update's trainer state and forward (`run.trainer_on_device`, `run.trainer`;
logprobs.py in train.grpo_update) and the weight sync (`run.engine.sync_weights`); train()'s one
`INFRA: statistics` block calls metrics.py. Beside them: the per-episode seeds
(`sampling.derive_seed`), imported environments in a pool (`imported.batched`, `imported.handle`,
`openenv.play_rounds`, `imported.seed_memory`), the fallback top-up (`baseline.load`) and the
update's FLOPs (`telemetry.model_flops`, `telemetry.sequence_flops`).

    run.py        Run: Accelerate, the Trainer (the policy with its optimizer and frozen reference),
                  the rollout engine (rollout_engine, eval.py's too) and the Sampler bound to it,
                  the distributed set-up; --preflight's reading of the run (preflight_plan)
    sampling.py   derive_seed (the seed rule) and the Sampler: one role's request stream a phase
    rundir.py     the run directory: its schema, its writers (metrics.jsonl, per-step files,
                  checkpoints, exports) and the readers tools/ share
    config.py     the command line: flags, presets, checks
    stream.py     the request stream agent.py and designer.py take: Completion, the Stream
                  protocol, a turn barrier over any batched generate (copy it beside them)
    engine.py     the transformers rollout engine (in process) and its streams; the weight plan
                  a vLLM sync streams
    vllm_engine.py VLLMEngine: vLLM colocated in the training processes (its request stream,
                  weight sync, sleep)
    logprobs.py   chunked token log-probs (the update's forward)
    models.py     model names, the tiny offline models, shipped dtypes and architectures
    metrics.py    the logged run statistics (Figs. 7, 9, 19), never trained on
    telemetry.py  step throughput and MFU (perf/*)
    preflight.py  the memory plan of a GPU run (--preflight), measured without weights or a GPU
    offload.py    --offload_trainer: trainer state to host RAM while vLLM generates
    lora.py       --lora_rank: adapters on the frozen policy, the reference they leave, exports
    baseline.py   the Fixed-env GRPO baseline's pool and draws; the fallback top-up
    imported.py   GEM / Gymnasium / OpenEnv environments in a pool; --memory_from
    openenv.py    OpenEnv servers in a pool: the hardened client, rounds within their capacity
    evaluation.py eval.py's held-out suites during the run (--eval_every), on its own engine

Leaves (stream, logprobs, models, metrics, telemetry, offload, preflight, config, rundir, lora)
import nothing of this repository; engine imports stream alone. The others import leaves and
concept files: run imports the leaves, engine, vllm_engine, sampling and evaluation (and agent.py,
grpo.py); vllm_engine imports engine and stream; sampling imports agent.py; openenv imports
sandbox.py; imported imports openenv (and memory.py, sandbox.py); baseline imports run,
sampling, imported, openenv and the leaves (and designer.py); evaluation imports eval.py (lazily,
inside its functions: the run that asks for it). Nothing else here imports train.py or eval.py,
and nothing tools/ (tools/ imports rundir).
"""
