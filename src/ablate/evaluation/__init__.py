"""Evaluation backends, each a config option of the group `eval` (conf/eval/): `heldout` (the method's own
metrics on the held-out split), `lm_eval` (EleutherAI's lm-evaluation-harness: downstream benchmarks) and
`judge` (a judged pairwise win rate against a baseline model). `ablate eval RUN` runs them on a saved run;
`eval=[...]` on `ablate train` or `ablate sweep` runs them at the end of each job. Each backend is built
from its node (`_target_`) and called with the model under evaluation (`base.Evaluand`); it returns its
metrics and one row per example (`base.Result`). `results` says which evaluations a run asks for and has,
and what eval.json and eval_examples.jsonl hold after a run of them; ablate.record.lifecycle.evaluate writes
them and hands them to the run's W&B run. Nothing here writes files: the run dir is record's."""
