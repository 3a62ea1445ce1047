"""Planning: from an InferenceService spec, the model's config.json and a GPU profile to a Plan.

Pure apart from reading config.json through an injected fetcher (outcome.py); nothing here talks to
Kubernetes, so `kvpilot plan` (command.py) runs the operator's exact decision without a cluster.

- model_facts: the architecture numbers planning needs, from config.json
- profiles: GPU profiles (the built-in catalog and the administrator's ConfigMap)
- sizing: byte arithmetic (weights per format, KV per token, workspace)
- planner: the choice of layout, formats and batch, within what the runtime can run
- reasons: one human sentence per choice
- plan: the Plan it produces (status.plan)
- outcome: a raw spec to a PlanOutcome (validate, find facts and profile, plan)
- command: `kvpilot plan -f manifest.yaml`
"""
